// safetensors reader and the Hugging Face weight layout: maps one
// .safetensors file read-only and validates its JSON header; a
// SafetensorsWeightSource spans one file or the shards named by
// model.safetensors.index.json and serves tensors under GGUF canonical names
// (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight). Owns file
// parsing and name mapping only; config.json is hf_config.h's job.
//
// File layout: u64 little-endian header length N | N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [b, e]},
//  "__metadata__": {...}} | data (offsets relative to the end of the header).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "models/ggml_types.h"
#include "models/loader/mapped_file.h"
#include "models/weights.h"

namespace kvserve::models {

struct SafetensorsTensorInfo {
  std::string name;  // as stored in the file
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;  // ggml order: reverse of the file's shape
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// Immutable after Open(): every const method may be called from any thread.
class SafetensorsFile {
 public:
  // Maps and validates `path`: header length within the file, header JSON
  // an object, every dtype F32/F16/BF16, data_offsets within the data
  // section and equal to shape x dtype size. InvalidArgument (NotFound for a
  // missing file) naming the path and tensor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  const std::string& path() const { return file_->path(); }
  void DropResidentPages() const { file_->DropResidentPages(); }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent; `name` as stored in the file.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  // String entries of "__metadata__".
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file)
      : file_(std::move(file)) {}
  absl::Status Parse();

  std::unique_ptr<MappedFile> file_;
  std::vector<SafetensorsTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// GGUF canonical name of an HF Llama-family tensor name, or nullopt for
// names outside the mapping (e.g. rotary_emb.inv_freq).
std::optional<std::string> HfToGgufName(std::string_view hf_name);

class SafetensorsWeightSource : public WeightSource {
 public:
  // `path` is a .safetensors file or an HF directory holding
  // model.safetensors.index.json (sharded) or model.safetensors. Shards must
  // lie in the directory and hold every tensor the index assigns to them;
  // two tensors mapping to the same canonical name are an error. Tensors
  // with unmapped names stay reachable under their HF names.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsWeightSource>>
  Open(const std::string& path);

  const std::string& origin() const override { return origin_; }
  bool Has(const std::string& name) const override;
  [[nodiscard]] absl::StatusOr<RawTensor> Get(
      const std::string& name) const override;

  std::map<std::string, int64_t> TensorBytesByType() const override;
  void DropResidentPages() const override {
    for (const auto& shard : shards_) shard->DropResidentPages();
  }

  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const {
    return shards_;
  }
  // Canonical names of all tensors, sorted.
  std::vector<std::string> Names() const;

 private:
  explicit SafetensorsWeightSource(std::string origin)
      : origin_(std::move(origin)) {}
  absl::Status AddShard(std::unique_ptr<SafetensorsFile> shard);

  std::string origin_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  absl::flat_hash_map<std::string, const SafetensorsTensorInfo*> by_name_;
};

}  // namespace kvserve::models
