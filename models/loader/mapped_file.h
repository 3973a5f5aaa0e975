// File access shared by the model loaders: MappedFile maps a whole file
// read-only (GGUF, safetensors; tensors handed out by the readers point into
// the mapping) and ReadFileToString reads small text files (config.json,
// index files). Parsing is the readers' job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve::models {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound if it does not exist, InvalidArgument if
  // it is not a regular file or is empty, Internal on mmap failure. Every
  // message names the path.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Unmaps the resident pages from this process (they stay in the page
  // cache): the bytes read the same, faulting back in where touched. For a
  // reader done with most of the file, e.g. after packing its weights.
  void DropResidentPages() const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads a whole (small) file. NotFound if it does not exist; InvalidArgument
// if it is larger than `max_bytes`. Messages name the path.
[[nodiscard]] absl::StatusOr<std::string> ReadFileToString(
    const std::string& path, size_t max_bytes = size_t{256} << 20);

}  // namespace kvserve::models
