#include "models/loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::models {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg)
                         : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat(path, ": fstat failed: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": file is empty"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // The mapping keeps its own reference to the file.
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
  }
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(p), size));
}

MappedFile::~MappedFile() { ::munmap(const_cast<uint8_t*>(data_), size_); }

void MappedFile::DropResidentPages() const {
  // A private read-only file mapping has no dirty pages, so MADV_DONTNEED
  // only drops them from the page tables; failure just keeps them.
  (void)::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             size_t max_bytes) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open(path));
  if (f->size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", f->size(), " bytes, more than the ",
                     max_bytes, " allowed"));
  }
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

}  // namespace kvserve::models
