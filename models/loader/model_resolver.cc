#include "models/loader/model_resolver.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "models/loader/presets.h"

namespace kvserve::models {
namespace {

namespace fs = std::filesystem;

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool Exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

bool EndsWithGguf(std::string_view s) {
  return s.size() >= 5 &&
         absl::EqualsIgnoreCase(absl::string_view(s.data() + s.size() - 5, 5),
                                ".gguf");
}

// Sorted names of the regular files (or directories) directly in `dir`.
std::vector<std::string> ListDir(const fs::path& dir, bool want_dirs) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code type_ec;
    const bool match =
        want_dirs ? it->is_directory(type_ec) : it->is_regular_file(type_ec);
    if (match) names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Snapshot directory of `repo` ("org/name") in the HF cache, if one holds
// config.json. Records the pattern it checked in `looked`.
std::optional<std::string> FindInHfCache(const std::string& cache_root,
                                         const std::string& repo,
                                         std::vector<std::string>& looked) {
  const size_t slash = repo.find('/');
  const fs::path model_dir =
      fs::path(cache_root) / absl::StrCat("models--", repo.substr(0, slash),
                                          "--", repo.substr(slash + 1));
  const fs::path snapshots = model_dir / "snapshots";
  looked.push_back((snapshots / "*" / "config.json").string());
  std::ifstream ref(model_dir / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev)) {
    rev = std::string(absl::StripAsciiWhitespace(rev));
    if (!rev.empty() && rev.find('/') == std::string::npos &&
        IsFile(snapshots / rev / "config.json")) {
      return (snapshots / rev).string();
    }
  }
  for (const std::string& snap : ListDir(snapshots, /*want_dirs=*/true)) {
    if (IsFile(snapshots / snap / "config.json")) {
      return (snapshots / snap).string();
    }
  }
  return std::nullopt;
}

// Weights of `preset` in one models directory, if any.
std::optional<std::string> FindInModelsDir(const ModelPreset& preset,
                                           const fs::path& dir,
                                           std::vector<std::string>& looked) {
  for (const std::string& f : preset.file_names) {
    looked.push_back((dir / f).string());
    if (IsFile(dir / f)) return (dir / f).string();
  }
  looked.push_back(absl::StrCat((dir / "*.gguf").string(), " named like ",
                                absl::StrJoin(preset.gguf_patterns, " or ")));
  for (const std::string& f : ListDir(dir, /*want_dirs=*/false)) {
    if (preset.MatchesGgufFileName(f)) return (dir / f).string();
  }
  std::vector<std::string> subdirs = {preset.name};
  for (const std::string& repo : preset.AllHfRepos()) {
    subdirs.push_back(repo.substr(repo.find('/') + 1));
    subdirs.push_back(repo);
  }
  for (const std::string& sub : subdirs) {
    looked.push_back((dir / sub / "config.json").string());
    if (IsFile(dir / sub / "config.json")) return (dir / sub).string();
  }
  return std::nullopt;
}

std::string HowToProvideWeights(const ModelPreset* preset) {
  std::string msg =
      "To use it, point kvserve at its weights: --model /path/to/file.gguf or "
      "an HF directory (with config.json); or put them in a models directory "
      "and set KVSERVE_MODELS_DIR=/path/to/models";
  if (preset != nullptr) {
    absl::StrAppend(&msg, "; or download them into the HF cache (",
                    "huggingface-cli download ", preset->hf_repo, ")",
                    "; or run it simulated, without weights: --device "
                    "sim:h200x2 (simulated tokens and step times on a "
                    "modelled GPU)");
  }
  absl::StrAppend(&msg, ". The default model (smollm2-135m, ",
                  "SmolLM2-135M-Instruct.Q4_1.gguf) is installed into "
                  "weights/ by deploy/setup.sh.");
  return msg;
}

absl::StatusOr<std::string> ResolvePreset(const ModelPreset& preset,
                                          std::string_view asked,
                                          const ResolverOptions& opts) {
  std::vector<std::string> looked;
  for (const std::string& dir : opts.models_dirs) {
    if (!IsDir(dir)) {
      looked.push_back(absl::StrCat(dir, " (directory does not exist)"));
      continue;
    }
    std::optional<std::string> hit = FindInModelsDir(preset, dir, looked);
    if (hit) return *hit;
  }
  if (!opts.hf_cache_dir.empty()) {
    for (const std::string& repo : preset.AllHfRepos()) {
      std::optional<std::string> hit =
          FindInHfCache(opts.hf_cache_dir, repo, looked);
      if (hit) return *hit;
    }
  }
  const std::string shown =
      NormalizeModelName(asked) == NormalizeModelName(preset.name)
          ? absl::StrCat("'", preset.name, "'")
          : absl::StrCat("'", std::string(asked), "' (preset ", preset.name,
                         ")");
  return absl::NotFoundError(
      absl::StrCat("weights for model ", shown, " (HF ", preset.hf_repo,
                   ") not found. Looked in:\n  ", absl::StrJoin(looked, "\n  "),
                   "\n", HowToProvideWeights(&preset)));
}

// "org/name" with two plain components (no "." or ".." and no empties).
bool IsPlainRepoId(std::string_view s) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(s.data(), s.size()), '/');
  return parts.size() == 2 &&
         std::all_of(parts.begin(), parts.end(), [](absl::string_view p) {
           return !p.empty() && p != "." && p != "..";
         });
}

absl::StatusOr<std::string> ResolveExplicitPath(std::string_view path,
                                                const ResolverOptions& opts) {
  std::string p(path);
  if (opts.confine_to_dirs && fs::path(p).is_relative()) {
    for (const std::string& dir : opts.models_dirs) {
      const fs::path in_dir = (fs::path(dir) / p).lexically_normal();
      if (Exists(in_dir)) return in_dir.string();
    }
  }
  if (Exists(p)) return p;
  if (const ModelPreset* preset = FindPreset(path);
      preset != nullptr && IsPlainRepoId(path)) {
    return ResolvePreset(*preset, path, opts);
  }
  std::vector<std::string> looked;
  if (path.find('/') == std::string_view::npos) {  // bare "x.gguf"
    for (const std::string& dir : opts.models_dirs) {
      looked.push_back((fs::path(dir) / p).string());
      if (IsFile(fs::path(dir) / p)) return looked.back();
    }
  } else if (IsPlainRepoId(path) && !opts.hf_cache_dir.empty()) {
    std::optional<std::string> hit =
        FindInHfCache(opts.hf_cache_dir, p, looked);
    if (hit) return *hit;
  }
  std::string msg = absl::StrCat("model path '", p, "' does not exist");
  if (!looked.empty()) {
    absl::StrAppend(&msg, "; also looked in:\n  ",
                    absl::StrJoin(looked, "\n  "), "\n");
  } else {
    absl::StrAppend(&msg, ". ");
  }
  absl::StrAppend(&msg, HowToProvideWeights(nullptr));
  return absl::NotFoundError(msg);
}

// The allowed roots, canonical (roots that do not exist are skipped).
std::vector<fs::path> AllowedRoots(const ResolverOptions& opts) {
  std::vector<std::string> dirs = opts.models_dirs;
  if (!opts.hf_cache_dir.empty()) dirs.push_back(opts.hf_cache_dir);
  std::vector<fs::path> roots;
  for (const std::string& d : dirs) {
    std::error_code ec;
    fs::path c = fs::canonical(d, ec);
    if (!ec) roots.push_back(std::move(c));
  }
  return roots;
}

// True if canonical `p` is `root` or below it (whole components).
bool IsUnder(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

absl::Status OutsideError(const std::string& asked, const std::string& real,
                          const ResolverOptions& opts) {
  std::vector<std::string> dirs = opts.models_dirs;
  if (!opts.hf_cache_dir.empty()) dirs.push_back(opts.hf_cache_dir);
  return absl::PermissionDeniedError(absl::StrCat(
      "model path '", asked, "' resolves to '", real,
      "', outside the allowed model directories (", absl::StrJoin(dirs, ", "),
      "); only models inside them load (--model-dirs)"));
}

// `resolved` (and, for a directory, each entry in it) inside the roots.
absl::Status CheckConfined(const std::string& resolved,
                           const ResolverOptions& opts) {
  const std::vector<fs::path> roots = AllowedRoots(opts);
  auto inside = [&](const fs::path& p, fs::path* real) {
    std::error_code ec;
    *real = fs::canonical(p, ec);
    if (ec) return false;
    return std::any_of(roots.begin(), roots.end(),
                       [&](const fs::path& r) { return IsUnder(*real, r); });
  };
  fs::path real;
  if (!inside(resolved, &real)) {
    return OutsideError(resolved, real.empty() ? resolved : real.string(),
                        opts);
  }
  if (!IsDir(real)) return absl::OkStatus();
  std::error_code ec;
  for (fs::directory_iterator it(real, ec), end; !ec && it != end;
       it.increment(ec)) {
    fs::path entry_real;
    if (!inside(it->path(), &entry_real)) {
      return OutsideError(
          it->path().string(),
          entry_real.empty() ? it->path().string() : entry_real.string(), opts);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveUnconfined(std::string_view name_or_path,
                                              const ResolverOptions& opts) {
  if (name_or_path.find('/') != std::string_view::npos ||
      EndsWithGguf(name_or_path)) {
    return ResolveExplicitPath(name_or_path, opts);
  }
  if (name_or_path == "." || name_or_path == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model name '", std::string(name_or_path),
        "' is a path component, not a model name; to load a directory pass "
        "it as a path, e.g. --model ./my-model"));
  }
  if (const ModelPreset* preset = FindPreset(name_or_path)) {
    return ResolvePreset(*preset, name_or_path, opts);
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model '", std::string(name_or_path),
      "': not a preset and not a path. Presets: ", PresetNames(),
      ". To load weights from disk pass a path: --model /path/to/file.gguf "
      "or an HF directory (a bare directory name needs ./, e.g. ./",
      std::string(name_or_path), ")."));
}

}  // namespace

ResolverOptions DefaultResolverOptions() {
  ResolverOptions opts;
  auto add_dir = [&](std::string dir) {
    if (dir.empty()) return;
    if (std::find(opts.models_dirs.begin(), opts.models_dirs.end(), dir) ==
        opts.models_dirs.end()) {
      opts.models_dirs.push_back(std::move(dir));
    }
  };
  for (absl::string_view d :
       absl::StrSplit(GetEnv("KVSERVE_MODELS_DIR"), ':', absl::SkipEmpty())) {
    add_dir(std::string(d));
  }
#ifdef KVSERVE_WEIGHTS_DIR
  add_dir(KVSERVE_WEIGHTS_DIR);
#endif
  const std::string home = GetEnv("HOME");
  if (!home.empty()) add_dir(home + "/.cache/kvserve/models");
  if (std::string hub = GetEnv("HF_HUB_CACHE"); !hub.empty()) {
    opts.hf_cache_dir = hub;
  } else if (std::string hf_home = GetEnv("HF_HOME"); !hf_home.empty()) {
    opts.hf_cache_dir = hf_home + "/hub";
  } else if (!home.empty()) {
    opts.hf_cache_dir = home + "/.cache/huggingface/hub";
  }
  return opts;
}

absl::StatusOr<std::string> ResolveModelPath(std::string_view name_or_path,
                                             const ResolverOptions& opts) {
  if (name_or_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name is empty; pass a preset name (", PresetNames(),
                     ") or a path"));
  }
  KV_ASSIGN_OR_RETURN(std::string path, ResolveUnconfined(name_or_path, opts));
  if (opts.confine_to_dirs) {
    KV_RETURN_IF_ERROR(CheckConfined(path, opts));
  }
  return path;
}

}  // namespace kvserve::models
