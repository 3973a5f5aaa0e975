// models/cuda/cublas_loader.cc: cuBLAS is mapped only once a cuBLAS call is
// made, and then resolves from the toolkit the build found. Needs no GPU
// (cublasGetStatusString needs no device); skipped in builds without the
// real CUDA backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#if defined(KVSERVE_CUDA) && !defined(KVSERVE_CUDA_EMU)
#include <cublas_v2.h>
#endif

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

TEST(CublasLoaderTest, OpensCublasOnFirstUseOnly) {
#if defined(KVSERVE_CUDA) && !defined(KVSERVE_CUDA_EMU)
  EXPECT_FALSE(Mapped("libcublas")) << "cuBLAS mapped before any call";
  // The library's own text ("success" in cuBLAS 13), not the loader's.
  const std::string text = cublasGetStatusString(CUBLAS_STATUS_SUCCESS);
  EXPECT_THAT(text, Not(HasSubstr("cannot load cuBLAS")));
  EXPECT_THAT(text, HasSubstr("success"));
  EXPECT_TRUE(Mapped("libcublas.so"));
  EXPECT_TRUE(Mapped("libcublasLt.so"));
#else
  GTEST_SKIP() << "no real CUDA backend in this build";
#endif
}

}  // namespace
