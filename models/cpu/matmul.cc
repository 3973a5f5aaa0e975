#include "models/cpu/matmul.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "models/cpu/float_kernels.h"
#include "models/cpu/matmul_internal.h"
#include "models/cpu/quant_kernels.h"
#include "models/quant_blocks.h"

namespace kvserve::models::cpu {
namespace {

using internal::PackedData;

bool IsQuantized(GgmlType t) { return IsDecodable(t); }
bool IsFloat(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

absl::Status ValidateTensor(const RawTensor& t, int64_t* rows, int64_t* cols) {
  if (!IsQuantized(t.type) && !IsFloat(t.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackMatrix: ", t.name, ": unsupported type ",
                     std::string(TypeName(t.type))));
  }
  if (t.shape.empty() || t.shape.size() > 2 || t.shape[0] <= 0 ||
      (t.shape.size() == 2 && t.shape[1] <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackMatrix: ", t.name, ": expected shape {cols, rows}"));
  }
  *cols = t.shape[0];
  *rows = t.shape.size() == 2 ? t.shape[1] : 1;
  const int block = TypeTraits(t.type).block_size;
  if (*cols % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PackMatrix: ", t.name, ": cols ", *cols, " not a multiple of ", block,
        " for ", std::string(TypeName(t.type))));
  }
  const size_t want = RowBytes(t.type, *cols) * static_cast<size_t>(*rows);
  if (t.data == nullptr || t.nbytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackMatrix: ", t.name, ": ", t.nbytes,
                     " bytes of data, expected ", want));
  }
  return absl::OkStatus();
}

// all_paths: fp32 rows of quantized weights for kOwnFloat.
absl::Status PackAllPaths(const RawTensor& t, const PackOptions& options,
                          PackedData* d) {
  if (!options.all_paths || d->float_rows) return absl::OkStatus();
  std::vector<float> f32(static_cast<size_t>(d->rows * d->cols));
  KV_RETURN_IF_ERROR(
      internal::DequantizeRows(t.type, t.data, d->rows, d->cols, f32.data()));
  d->float_rows = internal::FloatRowsFromF32(f32.data(), d->rows, d->cols);
  return absl::OkStatus();
}

// kInt8Vnni on tiles, kOwnFloat on float rows; kAuto: tiles when present.
void RunMatMul(const float* x, int64_t m, const PackedData& d, float* y,
               MatMulPath path) {
  // kInt8Vnni is chosen only for quantized tiles.
  KV_DCHECK(path != MatMulPath::kInt8Vnni || d.tiles.has_value());
  if (path != MatMulPath::kOwnFloat && d.tiles.has_value()) {
    // Per 32 and, for the K-quant kinds, per 256 as llama.cpp's Q8_K.
    thread_local internal::QuantizedActs acts32, acts256;
    internal::ActSet acts;
    if (internal::NeedsActGroup(*d.tiles, 32)) {
      internal::QuantizeActivations(x, m, d.cols, &acts32);
      acts.per32 = &acts32;
    }
    if (internal::NeedsActGroup(*d.tiles, 256)) {
      internal::QuantizeActivations(x, m, d.cols, &acts256, false, 256);
      acts.per256 = &acts256;
    }
    internal::QuantMatMul(acts, *d.tiles, y);
    return;
  }
  KV_CHECK(d.float_rows.has_value(), "a packed matrix holds tiles or rows");
  internal::FloatMatMul(x, m, *d.float_rows, y);
}

}  // namespace

const char* PathName(MatMulPath p) {
  switch (p) {
    case MatMulPath::kAuto:
      return "auto";
    case MatMulPath::kInt8Vnni:
      return "int8_vnni";
    case MatMulPath::kOwnFloat:
      return "own_float";
  }
  return "unknown";
}

PackedMatrix::PackedMatrix() : data_(std::make_unique<PackedData>()) {}
PackedMatrix::PackedMatrix(std::unique_ptr<PackedData> data)
    : data_(std::move(data)) {}
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
PackedMatrix::~PackedMatrix() = default;

int64_t PackedMatrix::rows() const { return data_->rows; }
int64_t PackedMatrix::cols() const { return data_->cols; }
GgmlType PackedMatrix::source_type() const { return data_->type; }
size_t PackedMatrix::bytes() const { return data_->Bytes(); }

bool PackedMatrix::HasSmallTiles() const {
  if (!data_->tiles.has_value()) return false;
  const internal::QuantTiles& t = *data_->tiles;
  if (t.segments.empty()) return t.tile_stride <= internal::kSmallTileBytes;
  for (const internal::QuantTiles& s : t.segments) {
    if (s.tile_stride <= internal::kSmallTileBytes) return true;
  }
  return false;
}

bool PackedMatrix::Supports(MatMulPath path) const {
  switch (path) {
    case MatMulPath::kAuto:
      return data_->tiles || data_->float_rows;
    case MatMulPath::kInt8Vnni:
      return data_->tiles.has_value();
    case MatMulPath::kOwnFloat:
      return data_->float_rows.has_value();
  }
  return false;
}

absl::StatusOr<PackedMatrix> PackMatrix(const RawTensor& t,
                                        const PackOptions& options) {
  int64_t rows = 0, cols = 0;
  KV_RETURN_IF_ERROR(ValidateTensor(t, &rows, &cols));
  auto d = std::make_unique<PackedData>();
  d->rows = rows;
  d->cols = cols;
  d->type = t.type;
  if (IsQuantized(t.type)) {
    KV_ASSIGN_OR_RETURN(d->tiles,
                        internal::PackQuantTiles(t.type, t.data, rows, cols));
  } else {
    KV_ASSIGN_OR_RETURN(d->float_rows,
                        internal::PackFloatRows(t.type, t.data, rows, cols));
  }
  absl::Status st = PackAllPaths(t, options, d.get());
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("PackMatrix: ", t.name, ": ", st.message()));
  }
  return PackedMatrix(std::move(d));
}

absl::StatusOr<PackedMatrix> PackQuantizedRows(
    const std::vector<RawTensor>& parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("PackQuantizedRows: no tensors");
  }
  auto d = std::make_unique<PackedData>();
  std::vector<internal::QuantRows> rows;
  for (const RawTensor& t : parts) {
    int64_t r = 0, cols = 0;
    KV_RETURN_IF_ERROR(ValidateTensor(t, &r, &cols));
    if (!IsQuantized(t.type) || cols != parts[0].shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PackQuantizedRows: ", t.name, ": ", std::string(TypeName(t.type)),
          " x ", cols, " does not join quantized rows of ", parts[0].shape[0]));
    }
    rows.push_back({t.type, t.data, r});
    d->rows += r;
  }
  d->cols = parts[0].shape[0];
  d->type = parts[0].type;
  absl::StatusOr<internal::QuantTiles> tiles =
      internal::PackQuantTiles(rows, d->cols);
  if (!tiles.ok()) {
    return absl::Status(tiles.status().code(),
                        absl::StrCat("PackQuantizedRows: ", parts[0].name, ": ",
                                     tiles.status().message()));
  }
  d->tiles = *std::move(tiles);
  return PackedMatrix(std::move(d));
}

void MatMul(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  MatMulWithPath(x, m, w, y, MatMulPath::kAuto);
}

void MatMulWithPath(const float* x, int64_t m, const PackedMatrix& w, float* y,
                    MatMulPath path) {
  KV_CHECK(w.Supports(path), "MatMul: path ", PathName(path),
           " not packed for this matrix");
  if (m <= 0) return;
  RunMatMul(x, m, w.data(), y, path);
}

namespace internal {
std::atomic<bool> small_tiles_to_l1{true};
}  // namespace internal

void SetSmallTilePrefetch(TilePrefetchLevel level) {
  internal::small_tiles_to_l1.store(level == TilePrefetchLevel::kL1,
                                    std::memory_order_relaxed);
}

TilePrefetchLevel SmallTilePrefetch() {
  return internal::small_tiles_to_l1.load(std::memory_order_relaxed)
             ? TilePrefetchLevel::kL1
             : TilePrefetchLevel::kL2;
}

const char* TilePrefetchLevelName(TilePrefetchLevel level) {
  return level == TilePrefetchLevel::kL1 ? "L1" : "L2";
}

absl::StatusOr<std::vector<float>> DequantizeToF32(const RawTensor& t) {
  int64_t rows = 0, cols = 0;
  KV_RETURN_IF_ERROR(ValidateTensor(t, &rows, &cols));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  KV_RETURN_IF_ERROR(
      internal::DequantizeRows(t.type, t.data, rows, cols, out.data()));
  return out;
}

}  // namespace kvserve::models::cpu
