#include "models/loader/gguf.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace kvserve::models {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Smallest possible encodings, used to reject absurd counts before looping.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // key len, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // 1-D tensor

// Size of a fixed-size scalar value type; 0 for string/array/unknown.
size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownValueType(uint32_t t) { return t <= 12; }

bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes one integer element. False if it does not fit in int64.
bool LoadInt(GgufValueType t, const uint8_t* p, int64_t* out) {
  switch (t) {
    case GgufValueType::kUint8:
      *out = Load<uint8_t>(p);
      return true;
    case GgufValueType::kInt8:
      *out = Load<int8_t>(p);
      return true;
    case GgufValueType::kUint16:
      *out = Load<uint16_t>(p);
      return true;
    case GgufValueType::kInt16:
      *out = Load<int16_t>(p);
      return true;
    case GgufValueType::kUint32:
      *out = Load<uint32_t>(p);
      return true;
    case GgufValueType::kInt32:
      *out = Load<int32_t>(p);
      return true;
    case GgufValueType::kInt64:
      *out = Load<int64_t>(p);
      return true;
    case GgufValueType::kUint64: {
      const uint64_t v = Load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return false;
      }
      *out = static_cast<int64_t>(v);
      return true;
    }
    default:
      return false;
  }
}

double LoadFloat(GgufValueType t, const uint8_t* p) {
  return t == GgufValueType::kFloat32 ? Load<float>(p) : Load<double>(p);
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Walks the mapped bytes once, filling the GgufFile. Every read is bounds
// checked against the file size; nothing is allocated from an unchecked
// count.
class GgufFile::Parser {
 public:
  explicit Parser(GgufFile* f)
      : f_(f), p_(f->file_->data()), size_(f->file_->size()) {}

  absl::Status Parse() {
    uint64_t n_tensors = 0;
    uint64_t n_kv = 0;
    KV_RETURN_IF_ERROR(ReadHeader(&n_tensors, &n_kv));
    f_->kvs_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) KV_RETURN_IF_ERROR(ReadKv(i));
    KV_RETURN_IF_ERROR(ResolveAlignment());
    f_->tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      KV_RETURN_IF_ERROR(ReadTensorInfo(i));
    }
    const uint64_t a = f_->alignment_;
    f_->data_offset_ = (pos_ + a - 1) / a * a;
    for (GgufTensorInfo& t : f_->tensors_) KV_RETURN_IF_ERROR(Place(t));
    return absl::OkStatus();
  }

 private:
  template <typename... Args>
  absl::Status Error(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(path(), ": ", args...));
  }
  const std::string& path() const { return f_->path(); }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, const std::string& what) const {
    if (n > remaining()) {
      return Error("truncated file: ", what, " needs ", n, " bytes at offset ",
                   pos_, " but the file has ", size_, " bytes");
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(const std::string& what) {
    KV_RETURN_IF_ERROR(Need(sizeof(T), what));
    const T v = Load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string_view> ReadString(const std::string& what) {
    KV_ASSIGN_OR_RETURN(const uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return Error(what, ": string length ", len, " exceeds the ", remaining(),
                   " bytes left in the file");
    }
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status ReadHeader(uint64_t* n_tensors, uint64_t* n_kv) {
    KV_ASSIGN_OR_RETURN(const uint32_t magic, Read<uint32_t>("magic"));
    if (magic != kGgufMagic) return Error("not a GGUF file (bad magic)");
    KV_ASSIGN_OR_RETURN(const uint32_t version, Read<uint32_t>("version"));
    if (version == 1) return Error("GGUF version 1 is not supported");
    if (version != 2 && version != 3) {
      return Error("unsupported GGUF version ", version,
                   (version & 0xffff) == 0 ? " (big-endian file?)" : "");
    }
    f_->version_ = version;
    KV_ASSIGN_OR_RETURN(*n_tensors, Read<uint64_t>("tensor count"));
    KV_ASSIGN_OR_RETURN(*n_kv, Read<uint64_t>("metadata count"));
    if (*n_kv > remaining() / kMinKvBytes) {
      return Error("metadata count ", *n_kv, " is impossible for a file of ",
                   size_, " bytes");
    }
    if (*n_tensors > remaining() / kMinTensorInfoBytes) {
      return Error("tensor count ", *n_tensors, " is impossible for a file of ",
                   size_, " bytes");
    }
    return absl::OkStatus();
  }

  absl::Status ReadKv(uint64_t i) {
    KV_ASSIGN_OR_RETURN(const std::string_view key,
                        ReadString(absl::StrCat("metadata key #", i)));
    const std::string what =
        absl::StrCat("metadata key '", std::string(key), "'");
    if (key.empty()) return Error("metadata key #", i, " is empty");
    if (f_->kv_index_.contains(std::string(key)))
      return Error("duplicate ", what);
    KV_ASSIGN_OR_RETURN(const uint32_t type, Read<uint32_t>(what));
    if (!IsKnownValueType(type)) {
      return Error(what, ": unknown value type ", type);
    }
    GgufKv kv;
    kv.key = std::string(key);
    kv.type = static_cast<GgufValueType>(type);
    KV_RETURN_IF_ERROR(ReadValue(what, &kv));
    f_->kv_index_.emplace(kv.key, f_->kvs_.size());
    f_->kvs_.push_back(std::move(kv));
    return absl::OkStatus();
  }

  // Validates the value of `kv` at the cursor and records where it lies.
  absl::Status ReadValue(const std::string& what, GgufKv* kv) {
    if (kv->type == GgufValueType::kArray) {
      KV_ASSIGN_OR_RETURN(const uint32_t et, Read<uint32_t>(what));
      if (!IsKnownValueType(et)) {
        return Error(what, ": unknown array element type ", et);
      }
      kv->elem_type = static_cast<GgufValueType>(et);
      if (kv->elem_type == GgufValueType::kArray) {
        return Error(what, ": nested arrays are not supported");
      }
      KV_ASSIGN_OR_RETURN(kv->count, Read<uint64_t>(what));
    }
    kv->data = p_ + pos_;
    const size_t start = pos_;
    const GgufValueType t =
        kv->type == GgufValueType::kArray ? kv->elem_type : kv->type;
    if (t == GgufValueType::kString) {
      if (kv->count > remaining() / 8) {
        return Error(what, ": array count ", kv->count, " exceeds the ",
                     remaining(), " bytes left in the file");
      }
      for (uint64_t j = 0; j < kv->count; ++j) {
        KV_RETURN_IF_ERROR(ReadString(what).status());
      }
    } else {
      const size_t elem = ScalarSize(t);
      if (kv->count > remaining() / elem) {
        return Error(what, ": array count ", kv->count, " of ",
                     std::string(GgufValueTypeName(t)), " exceeds the ",
                     remaining(), " bytes left in the file");
      }
      KV_RETURN_IF_ERROR(Need(kv->count * elem, what));
      pos_ += kv->count * elem;
    }
    kv->nbytes = pos_ - start;
    return absl::OkStatus();
  }

  absl::Status ResolveAlignment() {
    if (!f_->Has("general.alignment")) return absl::OkStatus();
    KV_ASSIGN_OR_RETURN(const int64_t a, f_->GetInt("general.alignment"));
    if (a <= 0 || (a & (a - 1)) != 0 || a > (1 << 30)) {
      return Error("general.alignment ", a, " is not a power of two");
    }
    f_->alignment_ = static_cast<uint64_t>(a);
    return absl::OkStatus();
  }

  absl::Status ReadTensorInfo(uint64_t i) {
    KV_ASSIGN_OR_RETURN(const std::string_view name,
                        ReadString(absl::StrCat("tensor info #", i)));
    const std::string what = absl::StrCat("tensor '", std::string(name), "'");
    if (f_->tensor_index_.contains(std::string(name)))
      return Error("duplicate ", what);
    KV_ASSIGN_OR_RETURN(const uint32_t n_dims, Read<uint32_t>(what));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Error(what, ": n_dims ", n_dims, " not in [1, ", kMaxDims, "]");
    }
    GgufTensorInfo t;
    t.name = std::string(name);
    for (uint32_t d = 0; d < n_dims; ++d) {
      KV_ASSIGN_OR_RETURN(const uint64_t ne, Read<uint64_t>(what));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(what, ": dimension ", d, " is ", ne, ", too large");
      }
      t.shape.push_back(static_cast<int64_t>(ne));
    }
    KV_ASSIGN_OR_RETURN(const uint32_t type, Read<uint32_t>(what));
    t.type = static_cast<GgmlType>(type);
    const GgmlTypeTraits tr = TypeTraits(t.type);
    if (tr.block_size == 0) {
      return Error(what, ": unknown ggml type id ", type);
    }
    KV_ASSIGN_OR_RETURN(t.offset, Read<uint64_t>(what));
    KV_ASSIGN_OR_RETURN(t.nbytes, ByteSize(what, t.shape, t.type));
    f_->tensor_index_.emplace(t.name, f_->tensors_.size());
    f_->tensors_.push_back(std::move(t));
    return absl::OkStatus();
  }

  // Bytes of a tensor, refusing element counts that overflow.
  absl::StatusOr<size_t> ByteSize(const std::string& what,
                                  const std::vector<int64_t>& shape,
                                  GgmlType type) const {
    const GgmlTypeTraits tr = TypeTraits(type);
    if (shape[0] % tr.block_size != 0) {
      return Error(what, ": ne[0] = ", shape[0],
                   " is not a multiple of the block size ", tr.block_size,
                   " of type ", std::string(tr.name));
    }
    const uint64_t max = std::numeric_limits<int64_t>::max();
    uint64_t bytes = static_cast<uint64_t>(shape[0] / tr.block_size);
    if (bytes != 0 && tr.type_size > max / bytes) {
      return Error(what, ": byte size overflows");
    }
    bytes *= tr.type_size;
    uint64_t elems = static_cast<uint64_t>(shape[0]);
    for (size_t d = 1; d < shape.size(); ++d) {
      const uint64_t ne = static_cast<uint64_t>(shape[d]);
      if (ne != 0 && (bytes > max / ne || elems > max / ne)) {
        return Error(what, ": shape [", absl::StrJoin(shape, ", "),
                     "] overflows");
      }
      bytes *= ne;
      elems *= ne;
    }
    return static_cast<size_t>(bytes);
  }

  absl::Status Place(GgufTensorInfo& t) {
    const std::string what = absl::StrCat("tensor '", t.name, "'");
    if (t.offset % f_->alignment_ != 0) {
      return Error(what, ": data offset ", t.offset,
                   " is not a multiple of the alignment ", f_->alignment_);
    }
    const uint64_t base = f_->data_offset_;
    if (t.offset > size_ || base > size_ - t.offset ||
        t.nbytes > size_ - t.offset - base) {
      return Error(what, ": data [", t.offset, ", +", t.nbytes,
                   ") at data section ", base,
                   " extends past the end of the file (", size_, " bytes)");
    }
    t.data = p_ + base + t.offset;
    return absl::OkStatus();
  }

  GgufFile* f_;
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
};

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(
    const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped,
                      MappedFile::Open(path));
  std::unique_ptr<GgufFile> f(new GgufFile(std::move(mapped)));
  Parser parser(f.get());
  KV_RETURN_IF_ERROR(parser.Parse());
  return f;
}

bool GgufFile::Has(std::string_view key) const {
  return kv_index_.contains(std::string(key));
}

const GgufKv* GgufFile::FindKv(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

absl::StatusOr<const GgufKv*> GgufFile::Require(std::string_view key) const {
  const GgufKv* kv = FindKv(key);
  if (kv == nullptr) {
    return absl::NotFoundError(absl::StrCat(path(), ": missing metadata key '",
                                            std::string(key), "'"));
  }
  return kv;
}

absl::Status GgufFile::TypeError(const GgufKv& kv,
                                 std::string_view wanted) const {
  std::string got(GgufValueTypeName(kv.type));
  if (kv.type == GgufValueType::kArray) {
    absl::StrAppend(&got, " of ", std::string(GgufValueTypeName(kv.elem_type)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path(), ": metadata key '", kv.key, "' is ", got,
                   ", expected ", std::string(wanted)));
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kString) return TypeError(*kv, "string");
  return std::string(reinterpret_cast<const char*>(kv->data) + 8,
                     kv->nbytes - 8);
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  int64_t v = 0;
  if (!IsIntType(kv->type)) return TypeError(*kv, "an integer");
  if (!LoadInt(kv->type, kv->data, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(path(), ": metadata key '",
                                                   std::string(key),
                                                   "' does not fit in int64"));
  }
  return v;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (IsFloatType(kv->type)) return LoadFloat(kv->type, kv->data);
  if (IsIntType(kv->type)) {
    KV_ASSIGN_OR_RETURN(const int64_t v, GetInt(key));
    return static_cast<double>(v);
  }
  return TypeError(*kv, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kBool) return TypeError(*kv, "bool");
  return kv->data[0] != 0;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(
    std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kArray ||
      kv->elem_type != GgufValueType::kString) {
    return TypeError(*kv, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(kv->count);
  const uint8_t* p = kv->data;  // validated at Open()
  for (uint64_t i = 0; i < kv->count; ++i) {
    const uint64_t len = Load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), len);
    p += 8 + len;
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(
    std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kArray || !IsFloatType(kv->elem_type)) {
    return TypeError(*kv, "array of float");
  }
  std::vector<double> out(kv->count);
  const size_t elem = ScalarSize(kv->elem_type);
  for (uint64_t i = 0; i < kv->count; ++i) {
    out[i] = LoadFloat(kv->elem_type, kv->data + i * elem);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(
    std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kArray || !IsIntType(kv->elem_type)) {
    return TypeError(*kv, "array of integer");
  }
  std::vector<int64_t> out(kv->count);
  const size_t elem = ScalarSize(kv->elem_type);
  for (uint64_t i = 0; i < kv->count; ++i) {
    if (!LoadInt(kv->elem_type, kv->data + i * elem, &out[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(path(), ": metadata key '", std::string(key),
                       "' element ", i, " does not fit in int64"));
    }
  }
  return out;
}

absl::StatusOr<uint64_t> GgufFile::GetArrayLength(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufKv* kv, Require(key));
  if (kv->type != GgufValueType::kArray) return TypeError(*kv, "an array");
  return kv->count;
}

absl::StatusOr<std::string> GgufFile::GetStringOr(std::string_view key,
                                                  std::string fallback) const {
  if (!Has(key)) return fallback;
  return GetString(key);
}

absl::StatusOr<int64_t> GgufFile::GetIntOr(std::string_view key,
                                           int64_t fallback) const {
  if (!Has(key)) return fallback;
  return GetInt(key);
}

absl::StatusOr<double> GgufFile::GetFloatOr(std::string_view key,
                                            double fallback) const {
  if (!Has(key)) return fallback;
  return GetFloat(key);
}

absl::StatusOr<bool> GgufFile::GetBoolOr(std::string_view key,
                                         bool fallback) const {
  if (!Has(key)) return fallback;
  return GetBool(key);
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<RawTensor> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(path(), ": missing tensor ", std::string(name)));
  }
  RawTensor r;
  r.name = t->name;
  r.type = t->type;
  r.shape = t->shape;
  r.data = t->data;
  r.nbytes = t->nbytes;
  return r;
}

std::map<std::string, int64_t> GgufWeightSource::TensorBytesByType() const {
  std::map<std::string, int64_t> out;
  for (const GgufTensorInfo& t : file_->tensors()) {
    out[std::string(TypeName(t.type))] += static_cast<int64_t>(t.nbytes);
  }
  return out;
}

bool GgufWeightSource::Has(const std::string& name) const {
  return file_->FindTensor(name) != nullptr;
}

absl::StatusOr<RawTensor> GgufWeightSource::Get(const std::string& name) const {
  return file_->GetTensor(name);
}

}  // namespace kvserve::models
