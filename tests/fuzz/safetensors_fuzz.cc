// Fuzzes the safetensors reader and the HF config.json parser. The first
// input byte picks the target: even -> the bytes are a .safetensors file
// (8-byte header length, JSON header, data); odd -> the rest is config.json
// text for ParseHfConfig. Both must fail with a Status or return values
// that stay in bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "models/loader/hf_config.h"
#include "models/loader/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvserve::models {
namespace {

void FuzzSafetensors(const uint8_t* data, size_t size) {
  const std::string& path =
      kvserve::fuzz::WriteScratch(data, size, ".safetensors");
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return;
  for (const SafetensorsTensorInfo& t : (*file)->tensors()) {
    if ((*file)->Find(t.name) != &t) __builtin_trap();
    (void)HfToGgufName(t.name);
    if (t.nbytes > 0) {
      volatile uint8_t sink = t.data[0];
      sink = t.data[t.nbytes - 1];
      (void)sink;
    }
  }
}

}  // namespace
}  // namespace kvserve::models

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if ((data[0] & 1) == 0) {
    kvserve::models::FuzzSafetensors(data + 1, size - 1);
  } else {
    std::string_view json(reinterpret_cast<const char*>(data + 1), size - 1);
    (void)kvserve::models::ParseHfConfig(json, "fuzz/config.json");
  }
  return 0;
}
