// Raw weight tensors as a loader hands them to model construction. A
// WeightSource hides the file format (GGUF, sharded safetensors): tensors are
// named with GGUF's canonical names ("token_embd.weight",
// "blk.N.attn_q.weight", ...) whatever the file uses. Data stays owned by the
// source (mmap'd or converted); RawTensor is a non-owning view valid while
// the source lives.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/ggml_types.h"

namespace kvserve::models {

struct RawTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  // ggml order: shape[0] is the innermost (contiguous) dimension. A linear
  // layer weight of out_features x in_features has shape {in, out}.
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Human-readable origin for error messages (file or directory path).
  virtual const std::string& origin() const = 0;
  virtual bool Has(const std::string& name) const = 0;
  // The tensor `name`; NotFound naming the file and tensor if absent.
  [[nodiscard]] virtual absl::StatusOr<RawTensor> Get(
      const std::string& name) const = 0;
  // Bytes of every tensor the source holds, by ggml type name ("Q4_K").
  virtual std::map<std::string, int64_t> TensorBytesByType() const = 0;
  // Gives the pages of file-backed tensors back to the OS; every tensor
  // stays readable (touched pages fault back in). A no-op for memory.
  virtual void DropResidentPages() const {}
};

}  // namespace kvserve::models
