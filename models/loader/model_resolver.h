// Model path resolution: turns what a user passes as --model (a file, an HF
// directory, a preset name such as "llama3-70b", or an HF repo id) into a path
// on disk. It owns the search order (models directories, then the Hugging Face
// hub cache) and the one "not found" message that says where it looked and
// how to point kvserve at weights. It only inspects the file system: it never
// downloads, opens weights, or parses configs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::models {

struct ResolverOptions {
  // Searched in order. In each, for a preset: the preset's exact file names,
  // then *.gguf files matching its patterns (lexicographic order), then a
  // subdirectory named like the preset, an HF repo name, or org/name, that
  // holds config.json.
  std::vector<std::string> models_dirs;
  // HF hub cache root, laid out as models--{org}--{name}/snapshots/{rev}/;
  // empty = skip. refs/main picks the snapshot when present, else the first
  // snapshot (by name) holding config.json.
  std::string hf_cache_dir;
  // Confinement (kvserve serve --model-dirs): the resolved path, after ".."
  // and symlinks are resolved, must lie inside one of models_dirs or
  // hf_cache_dir, and so must every file directly inside a resolved
  // directory; relative paths are looked up inside the directories first.
  // Anything else is PermissionDenied. Off by default: the command line is
  // trusted and `--model /any/file.gguf` loads.
  bool confine_to_dirs = false;
};

// Reads the environment at call time. models_dirs: every entry of
// $KVSERVE_MODELS_DIR (':'-separated), then the compile-time
// KVSERVE_WEIGHTS_DIR (the repo's weights/), then ~/.cache/kvserve/models.
// hf_cache_dir: $HF_HUB_CACHE, else $HF_HOME/hub, else
// ~/.cache/huggingface/hub (empty if $HOME is unset too).
[[nodiscard]] ResolverOptions DefaultResolverOptions();

// Resolves `name_or_path`:
//  - An explicit path (contains '/' or ends in ".gguf") that exists, file or
//    directory, is returned unchanged.
//  - An HF repo id ("org/name") that is not an existing path resolves like
//    its preset if it has one, else only through the HF cache.
//  - A bare "*.gguf" file name that does not exist here is looked up in the
//    models directories.
//  - A preset name (see FindPreset) is searched as described in
//    ResolverOptions; the first hit wins.
// Errors: NotFound naming the path for a missing explicit path; NotFound
// naming the preset, every place looked (full paths) and how to provide
// weights for a preset; NotFound listing the presets for an unknown name;
// InvalidArgument for an empty name or a bare "." / ".." (names never escape
// the configured directories); PermissionDenied naming the path and the
// allowed directories when opts.confine_to_dirs and the result (or a symlink
// in it) leads outside them.
[[nodiscard]] absl::StatusOr<std::string> ResolveModelPath(
    std::string_view name_or_path,
    const ResolverOptions& opts = DefaultResolverOptions());

}  // namespace kvserve::models
