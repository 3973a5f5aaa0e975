// `kvserve generate`: one-shot generation from the command line, run as the
// server runs a request. Loads a model by preset name or path for --device,
// turns the flags into the v1::GenerateRequest a client would send (flags
// not given stay unset, so server::ToRequestSpec applies the server's
// defaults, chat rendering and limits), submits it to an engine::Engine
// sized for that one sequence, streams the text to stdout as it arrives,
// and prints load time, prefill and decode rates and the seed to stderr.
// Does not own sampling, stop rules or KV sizing arithmetic: the engine,
// server/request_validation and kvcache/kv_sizing do.
#pragma once

#include "absl/status/status.h"

namespace kvserve::cli {

// A field error of server::ToRequestSpec (proto paths, or Engine::Submit's
// through server::ToProtoFieldNames) named by the flag that set the field
// ("sampling.top_p" -> "--top-p"; chat message 0 is --system when
// `has_system`, else --prompt). Other statuses pass unchanged.
[[nodiscard]] absl::Status ToFlagNames(const absl::Status& status,
                                       bool has_system);

// Returns the process exit code: 0 ok, 1 runtime failure, 2 bad flags.
int RunGenerateCommand(int argc, const char* const* argv);

}  // namespace kvserve::cli
