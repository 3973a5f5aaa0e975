#include "models/loader/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvserve::models {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

absl::Status TensorError(const std::string& path, std::string_view tensor,
                         std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor ", std::string(tensor), " in ", path, ": ", std::string(why)));
}

bool DtypeToGgml(std::string_view dtype, GgmlType* type) {
  if (dtype == "F32") {
    *type = GgmlType::kF32;
  } else if (dtype == "F16") {
    *type = GgmlType::kF16;
  } else if (dtype == "BF16") {
    *type = GgmlType::kBF16;
  } else {
    return false;
  }
  return true;
}

// Reads a JSON array of non-negative integers (no exceptions).
bool ReadUintArray(const json& j, std::vector<uint64_t>* out) {
  if (!j.is_array()) return false;
  for (const json& v : j) {
    if (!v.is_number_unsigned()) return false;
    out->push_back(v.get<uint64_t>());
  }
  return true;
}

// Validates one header entry against the data section [0, data_size).
absl::StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& path,
                                                 const std::string& name,
                                                 const json& e,
                                                 const uint8_t* data,
                                                 uint64_t data_size) {
  if (!e.is_object()) return TensorError(path, name, "entry is not an object");
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) {
    return TensorError(path, name, "missing string 'dtype'");
  }
  SafetensorsTensorInfo t;
  t.name = name;
  const std::string& dtype = dt->get_ref<const std::string&>();
  if (!DtypeToGgml(dtype, &t.type)) {
    return TensorError(path, name,
                       absl::StrCat("unsupported dtype '", dtype,
                                    "' (supported: F32, F16, BF16)"));
  }
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
  auto sh = e.find("shape");
  if (sh == e.end() || !ReadUintArray(*sh, &shape)) {
    return TensorError(path, name, "'shape' is not an array of sizes");
  }
  auto off = e.find("data_offsets");
  if (off == e.end() || !ReadUintArray(*off, &offsets) || offsets.size() != 2) {
    return TensorError(path, name, "'data_offsets' is not [begin, end]");
  }
  uint64_t bytes = TypeTraits(t.type).type_size;
  for (uint64_t d : shape) {
    constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
    if (d != 0 && bytes > kMax / d) {
      return TensorError(path, name, "shape overflows");
    }
    bytes *= d;
  }
  const uint64_t begin = offsets[0];
  const uint64_t end = offsets[1];
  if (begin > end || end > data_size) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets [", begin, ", ", end,
                                    ") lie outside the data section of ",
                                    data_size, " bytes"));
  }
  if (end - begin != bytes) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets span ", end - begin,
                                    " bytes but shape x dtype needs ", bytes));
  }
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    t.shape.push_back(static_cast<int64_t>(*it));
  }
  t.data = data + begin;
  t.nbytes = static_cast<size_t>(bytes);
  return t;
}

absl::StatusOr<json> ParseJsonFile(const std::string& path) {
  KV_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid JSON object"));
  }
  return j;
}

// Shard file names from an index's weight_map, checked to stay inside the
// directory.
absl::StatusOr<std::set<std::string>> ShardNames(const std::string& index_path,
                                                 const json& weight_map) {
  std::set<std::string> names;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for tensor ", it.key(),
                       " is not a file name"));
    }
    const std::string& file = it.value().get_ref<const std::string&>();
    if (file.empty() || file == "." || file == ".." ||
        absl::StrContains(file, '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor ", it.key(),
                       " names an invalid shard file '", file, "'"));
    }
    names.insert(file);
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": weight_map is empty"));
  }
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped,
                      MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile(std::move(mapped)));
  KV_RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::Status SafetensorsFile::Parse() {
  const uint8_t* p = file_->data();
  const uint64_t size = file_->size();
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path(), ": truncated file: ", size, " bytes, no header length"));
  }
  uint64_t header_len;
  std::memcpy(&header_len, p, 8);
  if (header_len > size - 8 || header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": header length ", header_len,
                     " exceeds the file size ", size, " (or 100 MB)"));
  }
  const char* text = reinterpret_cast<const char*>(p + 8);
  json header =
      json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": header is not a valid JSON object"));
  }
  const uint8_t* data = p + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) continue;
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) {
          metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    KV_ASSIGN_OR_RETURN(
        SafetensorsTensorInfo t,
        ParseEntry(path(), it.key(), it.value(), data, data_size));
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  return absl::OkStatus();
}

const SafetensorsTensorInfo* SafetensorsFile::Find(
    std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::string> HfToGgufName(std::string_view n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  constexpr std::string_view kLayers = "model.layers.";
  if (!n.starts_with(kLayers)) return std::nullopt;
  n.remove_prefix(kLayers.size());
  const size_t dot = n.find('.');
  int layer = 0;
  if (dot == std::string_view::npos || dot == 0 ||
      !std::all_of(n.begin(), n.begin() + dot, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(std::string(n.substr(0, dot)), &layer)) {
    return std::nullopt;
  }
  const std::string_view rest = n.substr(dot + 1);
  static constexpr std::pair<std::string_view, const char*> kMap[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [hf, gguf] : kMap) {
    if (rest == hf) return absl::StrCat("blk.", layer, ".", gguf);
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<SafetensorsWeightSource>>
SafetensorsWeightSource::Open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::unique_ptr<SafetensorsWeightSource> src(
      new SafetensorsWeightSource(path));
  if (!fs::is_directory(path, ec)) {
    KV_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open(path));
    KV_RETURN_IF_ERROR(src->AddShard(std::move(shard)));
    return src;
  }
  const fs::path dir(path);
  const std::string index_path = (dir / kIndexFile).string();
  if (!fs::exists(index_path, ec)) {
    const std::string single = (dir / kSingleFile).string();
    if (!fs::exists(single, ec)) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no ", kSingleFile, " or ", kIndexFile));
    }
    KV_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open(single));
    KV_RETURN_IF_ERROR(src->AddShard(std::move(shard)));
    return src;
  }
  KV_ASSIGN_OR_RETURN(const json index, ParseJsonFile(index_path));
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": missing object 'weight_map'"));
  }
  KV_ASSIGN_OR_RETURN(const std::set<std::string> files,
                      ShardNames(index_path, *wm));
  for (const std::string& file : files) {
    KV_ASSIGN_OR_RETURN(auto shard,
                        SafetensorsFile::Open((dir / file).string()));
    KV_RETURN_IF_ERROR(src->AddShard(std::move(shard)));
  }
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string shard_path =
        (dir / it.value().get_ref<const std::string&>()).string();
    const auto& shards = src->shards_;
    auto s = std::find_if(shards.begin(), shards.end(), [&](const auto& f) {
      return f->path() == shard_path;
    });
    if (s == shards.end() || (*s)->Find(it.key()) == nullptr) {
      return absl::NotFoundError(absl::StrCat(index_path, ": tensor ", it.key(),
                                              " is not in its shard ",
                                              shard_path));
    }
  }
  return src;
}

absl::Status SafetensorsWeightSource::AddShard(
    std::unique_ptr<SafetensorsFile> shard) {
  for (const SafetensorsTensorInfo& t : shard->tensors()) {
    const std::string name = HfToGgufName(t.name).value_or(t.name);
    auto [it, inserted] = by_name_.emplace(name, &t);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, " in ", shard->path(), ": canonical name ", name,
          " is already taken by tensor ", it->second->name));
    }
  }
  shards_.push_back(std::move(shard));
  return absl::OkStatus();
}

std::map<std::string, int64_t> SafetensorsWeightSource::TensorBytesByType()
    const {
  std::map<std::string, int64_t> out;
  for (const auto& shard : shards_) {
    for (const SafetensorsTensorInfo& t : shard->tensors()) {
      out[std::string(TypeName(t.type))] += static_cast<int64_t>(t.nbytes);
    }
  }
  return out;
}

bool SafetensorsWeightSource::Has(const std::string& name) const {
  return by_name_.contains(name);
}

absl::StatusOr<RawTensor> SafetensorsWeightSource::Get(
    const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat(origin_, ": missing tensor ", name));
  }
  const SafetensorsTensorInfo& t = *it->second;
  RawTensor r;
  r.name = name;
  r.type = t.type;
  r.shape = t.shape;
  r.data = t.data;
  r.nbytes = t.nbytes;
  return r;
}

std::vector<std::string> SafetensorsWeightSource::Names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kvserve::models
