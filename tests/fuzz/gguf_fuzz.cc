// Fuzzes the GGUF reader: random bytes as a .gguf file. Open() must either
// fail with a Status or yield a file whose every metadata getter, tensor
// view and derived config/tokenizer read stays in bounds.
#include <cstddef>
#include <cstdint>

#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvserve::models {
namespace {

void Exercise(const GgufFile& file) {
  for (const GgufKv& kv : file.metadata()) {
    // Every typed getter on every key: wrong types must be errors.
    (void)file.GetString(kv.key);
    (void)file.GetInt(kv.key);
    (void)file.GetFloat(kv.key);
    (void)file.GetBool(kv.key);
    (void)file.GetStringArray(kv.key);
    (void)file.GetFloatArray(kv.key);
    (void)file.GetIntArray(kv.key);
    (void)file.GetArrayLength(kv.key);
  }
  for (const GgufTensorInfo& t : file.tensors()) {
    auto raw = file.GetTensor(t.name);
    if (raw.ok() && raw->nbytes > 0) {
      // The view must lie inside the mapping: touch its first and last byte.
      const auto* bytes = static_cast<const uint8_t*>(raw->data);
      volatile uint8_t sink = bytes[0];
      sink = bytes[raw->nbytes - 1];
      (void)sink;
    }
  }
  (void)ModelConfigFromGguf(file);
  auto tok = TokenizerDataFromGguf(file);
  if (tok.ok()) (void)Tokenizer::Create(*std::move(tok));
}

}  // namespace
}  // namespace kvserve::models

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvserve::fuzz::WriteScratch(data, size, ".gguf");
  auto file = kvserve::models::GgufFile::Open(path);
  if (file.ok()) kvserve::models::Exercise(**file);
  return 0;
}
