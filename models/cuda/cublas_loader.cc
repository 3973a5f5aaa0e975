// The cuBLAS entry points the CUDA forward calls, resolved from libcublas on
// first use instead of at link time. Linked, cuBLAS is mapped into every run
// of the binary, a CPU-only one included, and its start-up touches ~200 MiB
// of its own static data (measured: libcublasLt's file pages plus two large
// anonymous segments). Opened here, only a process that creates a cuBLAS
// handle pays for it. Where the library cannot be opened every call fails
// with CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString says why.
// The SIMT emulator build (KVSERVE_CUDA_EMU) defines these functions itself.
#ifndef KVSERVE_CUDA_EMU

#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#ifndef KVSERVE_CUBLAS_SONAME
#define KVSERVE_CUBLAS_SONAME "libcublas.so"
#endif
#ifndef KVSERVE_CUBLAS_PATH
#define KVSERVE_CUBLAS_PATH KVSERVE_CUBLAS_SONAME
#endif

namespace {

struct CublasLibrary {
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using SetMathMode = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                    cublasOperation_t, int, int, int,
                                    const void*, const void*, cudaDataType, int,
                                    const void*, cudaDataType, int, const void*,
                                    void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  using StatusString = const char* (*)(cublasStatus_t);

  Create create = nullptr;
  Destroy destroy = nullptr;
  SetStream set_stream = nullptr;
  SetMathMode set_math_mode = nullptr;
  GemmEx gemm_ex = nullptr;
  StatusString status_string = nullptr;
  std::string error;  // why the library is unusable; empty when loaded
};

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr && error->empty()) {
    *error = std::string(KVSERVE_CUBLAS_SONAME " lacks ") + name;
  }
  return *out != nullptr;
}

CublasLibrary Open() {
  CublasLibrary l;
  // The soname through the loader's search path (LD_LIBRARY_PATH, the
  // binary's run path, ld.so.conf), then the toolkit the build found.
  void* lib = dlopen(KVSERVE_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen(KVSERVE_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    l.error = std::string("cannot load cuBLAS (" KVSERVE_CUBLAS_SONAME "): ") +
              (why != nullptr ? why : "unknown error") +
              "; install the CUDA toolkit's cuBLAS or add its directory to "
              "LD_LIBRARY_PATH";
    return l;
  }
  bool ok = Resolve(lib, "cublasCreate_v2", &l.create, &l.error);
  ok &= Resolve(lib, "cublasDestroy_v2", &l.destroy, &l.error);
  ok &= Resolve(lib, "cublasSetStream_v2", &l.set_stream, &l.error);
  ok &= Resolve(lib, "cublasSetMathMode", &l.set_math_mode, &l.error);
  ok &= Resolve(lib, "cublasGemmEx", &l.gemm_ex, &l.error);
  ok &= Resolve(lib, "cublasGetStatusString", &l.status_string, &l.error);
  if (!ok) l.create = nullptr;  // every call then fails cleanly
  return l;
}

const CublasLibrary& Library() {
  static const CublasLibrary* const lib = new CublasLibrary(Open());
  return *lib;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  const CublasLibrary& l = Library();
  return l.create != nullptr ? l.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  const CublasLibrary& l = Library();
  return l.create != nullptr ? l.destroy(handle)
                             : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle,
                                               cudaStream_t stream) {
  const CublasLibrary& l = Library();
  return l.create != nullptr ? l.set_stream(handle, stream)
                             : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle,
                                              cublasMath_t mode) {
  const CublasLibrary& l = Library();
  return l.create != nullptr ? l.set_math_mode(handle, mode)
                             : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* a, cudaDataType a_type,
    int lda, const void* b, cudaDataType b_type, int ldb, const void* beta,
    void* c, cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
    cublasGemmAlgo_t algo) {
  const CublasLibrary& l = Library();
  return l.create != nullptr ? l.gemm_ex(handle, transa, transb, m, n, k, alpha,
                                         a, a_type, lda, b, b_type, ldb, beta,
                                         c, c_type, ldc, compute_type, algo)
                             : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  const CublasLibrary& l = Library();
  if (l.create == nullptr) return l.error.c_str();
  return l.status_string(status);
}

}  // extern "C"

#endif  // KVSERVE_CUDA_EMU
