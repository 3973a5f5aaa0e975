#include "models/loader/model_fingerprint.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/loader/mapped_file.h"

namespace kvserve::models {
namespace {

constexpr uint64_t kHeadBytes = uint64_t{16} << 20;
constexpr uint64_t kSamples = 4096;
constexpr uint64_t kSampleBytes = 4096;

struct HashState {
  HashState() { XXH3_128bits_reset(state); }
  ~HashState() { XXH3_freeState(state); }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
  void Add(const void* p, size_t n) { XXH3_128bits_update(state, p, n); }
  void AddU64(uint64_t v) { Add(&v, sizeof(v)); }
  void AddString(const std::string& s) {
    AddU64(s.size());
    Add(s.data(), s.size());
  }
  XXH3_state_t* state = XXH3_createState();
};

// The files that make up the model at `path`, sorted by name.
absl::StatusOr<std::vector<std::string>> ModelFilesAt(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::vector<std::string>{path};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && (absl::EndsWith(name, ".safetensors") ||
                                  absl::EndsWith(name, ".json"))) {
      files.push_back(e.path().string());
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model fingerprint: cannot list ", path, ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Bytes [0, head) then kSamples pages spread over the rest.
uint64_t AddSampled(const MappedFile& f, HashState* h) {
  const uint64_t size = f.size();
  const uint64_t head = std::min(size, kHeadBytes);
  h->Add(f.data(), head);
  uint64_t hashed = head;
  if (size <= head) return hashed;
  const uint64_t span = size - head;
  for (uint64_t i = 0; i < kSamples; ++i) {
    const uint64_t at = head + span / kSamples * i;
    const uint64_t n = std::min(kSampleBytes, size - at);
    h->Add(f.data() + at, n);
    hashed += n;
  }
  return hashed;
}

}  // namespace

absl::StatusOr<ModelFingerprint> FingerprintModel(const std::string& path,
                                                  const std::string& extra,
                                                  uint64_t full_limit) {
  KV_ASSIGN_OR_RETURN(std::vector<std::string> names, ModelFilesAt(path));
  std::vector<std::unique_ptr<MappedFile>> files;
  ModelFingerprint fp;
  for (const std::string& name : names) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open(name));
    fp.bytes += f->size();
    files.push_back(std::move(f));
  }
  fp.full = fp.bytes <= full_limit;
  HashState h;
  h.AddString("kvserve-model-fingerprint-v1");
  h.AddString(extra);
  h.AddU64(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const MappedFile& f = *files[i];
    // A directory's files by name; a single file's name is not content.
    h.AddString(files.size() > 1 || names[i] != path
                    ? std::filesystem::path(names[i]).filename().string()
                    : std::string());
    h.AddU64(f.size());
    if (fp.full) {
      h.Add(f.data(), f.size());
      fp.hashed += f.size();
    } else {
      fp.hashed += AddSampled(f, &h);
    }
  }
  const XXH128_hash_t d = XXH3_128bits_digest(h.state);
  fp.hash = absl::MakeUint128(d.high64, d.low64);
  return fp;
}

}  // namespace kvserve::models
