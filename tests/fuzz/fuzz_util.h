// Helpers shared by the libFuzzer targets: the readers under test map files
// (MappedFile), so inputs go through a per-process scratch file; the default
// model's tokenizer is loaded once per process.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/tokenizer_json.h"

namespace kvserve::fuzz {

// Writes `data` to this process's scratch file (under $TMPDIR, else /tmp)
// and returns its path; every call overwrites the previous contents.
inline const std::string& WriteScratch(const uint8_t* data, size_t size,
                                       const char* suffix) {
  static const std::string* path = [suffix] {
    const char* dir = std::getenv("TMPDIR");
    return new std::string(std::string(dir != nullptr ? dir : "/tmp") +
                           "/kvserve_fuzz_" + std::to_string(getpid()) +
                           suffix);
  }();
  FILE* f = std::fopen(path->c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return *path;
}

// The default model's tokenizer (weights/, byte-level BPE), else the small
// byte-level tokenizer of tests/data. Aborts if neither loads.
inline const models::Tokenizer& DefaultTokenizer() {
  static const models::Tokenizer* tok = [] {
    const std::string src = KVSERVE_SOURCE_DIR;
    absl::StatusOr<models::TokenizerData> data =
        absl::NotFoundError("no model");
    auto file = models::GgufFile::Open(
        src + "/weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (file.ok()) data = models::TokenizerDataFromGguf(**file);
    if (!data.ok()) {
      data = models::ReadTokenizerJson(
          src + "/tests/data/tokenizer/bytelevel_small_tokenizer.json");
    }
    if (!data.ok()) {
      std::fprintf(stderr, "fuzz: no tokenizer: %s\n",
                   std::string(data.status().message()).c_str());
      std::abort();
    }
    auto t = models::Tokenizer::Create(*std::move(data));
    if (!t.ok()) std::abort();
    return t->release();
  }();
  return *tok;
}

}  // namespace kvserve::fuzz
