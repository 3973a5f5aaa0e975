// GGUF (v2 and v3) reader: maps a .gguf file read-only, validates the
// header, every metadata key/value and every tensor info, and exposes typed
// metadata getters plus non-owning tensor views into the mapping. It owns
// parsing and bounds checking only; turning metadata into a ModelConfig or
// TokenizerData lives in gguf_config.h, dequantization in dequant.h.
//
// File layout (all little-endian):
//
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x       { string key | u32 value_type | value }
//   n_tensors x  { string name | u32 n_dims | n_dims x u64 ne
//                  | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   data section: tensor i at data_offset + offset_i (each aligned)
//
// where string = u64 length + bytes (no terminator) and an array value is
// u32 element_type + u64 count + elements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/ggml_types.h"
#include "models/loader/mapped_file.h"
#include "models/weights.h"

namespace kvserve::models {

// GGUF metadata value types, as stored in the file.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufValueTypeName(GgufValueType t);

// One metadata entry, validated at Open(); `data` points into the mapping.
struct GgufKv {
  std::string key;
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType elem_type = GgufValueType::kUint8;  // arrays only
  uint64_t count = 1;             // array element count (1 for scalars)
  const uint8_t* data = nullptr;  // scalar bytes, string length, or elements
  size_t nbytes = 0;              // bytes of the value payload
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;  // ggml order (ne[0] innermost)
  uint64_t offset = 0;         // relative to the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping, bounds-checked

  int64_t NumElements() const;
};

// Immutable after Open(): every const method may be called from any thread.
class GgufFile {
 public:
  // Maps and validates `path`. Every failure is a Status (InvalidArgument
  // for malformed content, NotFound for a missing file) whose message names
  // the path and, where relevant, the key or tensor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GgufFile>> Open(
      const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Byte offset of the data section from the start of the file.
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return file_->size(); }
  void DropResidentPages() const { file_->DropResidentPages(); }

  // --- Metadata ---------------------------------------------------------
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  bool Has(std::string_view key) const;
  // nullptr if absent.
  const GgufKv* FindKv(std::string_view key) const;

  // Typed getters: NotFound if the key is absent, InvalidArgument if its
  // type does not fit. GetInt accepts every integer type (and rejects a
  // uint64 above INT64_MAX); GetFloat accepts float32/64 and integers.
  [[nodiscard]] absl::StatusOr<std::string> GetString(
      std::string_view key) const;
  [[nodiscard]] absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  [[nodiscard]] absl::StatusOr<double> GetFloat(std::string_view key) const;
  [[nodiscard]] absl::StatusOr<bool> GetBool(std::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> GetStringArray(
      std::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::vector<double>> GetFloatArray(
      std::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> GetIntArray(
      std::string_view key) const;
  // Element count of an array value.
  [[nodiscard]] absl::StatusOr<uint64_t> GetArrayLength(
      std::string_view key) const;

  // Same, but `fallback` when the key is absent (a wrong type is still an
  // error).
  [[nodiscard]] absl::StatusOr<std::string> GetStringOr(
      std::string_view key, std::string fallback) const;
  [[nodiscard]] absl::StatusOr<int64_t> GetIntOr(std::string_view key,
                                                 int64_t fallback) const;
  [[nodiscard]] absl::StatusOr<double> GetFloatOr(std::string_view key,
                                                  double fallback) const;
  [[nodiscard]] absl::StatusOr<bool> GetBoolOr(std::string_view key,
                                               bool fallback) const;

  // --- Tensors ------------------------------------------------------------
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // A view of tensor `name` (NotFound naming file and tensor if absent).
  [[nodiscard]] absl::StatusOr<RawTensor> GetTensor(
      std::string_view name) const;

 private:
  class Parser;
  explicit GgufFile(std::unique_ptr<MappedFile> file)
      : file_(std::move(file)) {}

  absl::StatusOr<const GgufKv*> Require(std::string_view key) const;
  absl::Status TypeError(const GgufKv& kv, std::string_view wanted) const;

  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  absl::flat_hash_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

// WeightSource over a GGUF file: names are already canonical; tensors are
// views into the mapping, valid while the source lives.
class GgufWeightSource : public WeightSource {
 public:
  explicit GgufWeightSource(std::unique_ptr<GgufFile> file)
      : file_(std::move(file)) {}

  const std::string& origin() const override { return file_->path(); }
  bool Has(const std::string& name) const override;
  [[nodiscard]] absl::StatusOr<RawTensor> Get(
      const std::string& name) const override;

  std::map<std::string, int64_t> TensorBytesByType() const override;
  void DropResidentPages() const override { file_->DropResidentPages(); }

  const GgufFile& file() const { return *file_; }

 private:
  std::unique_ptr<GgufFile> file_;
};

}  // namespace kvserve::models
