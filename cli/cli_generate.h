// `kvserve generate`: one-shot generation from the command line. Loads a
// model by preset name or path, streams the continuation to stdout, and
// prints prefill and decode throughput to stderr.
#pragma once

namespace kvserve::cli {

// Returns the process exit code: 0 ok, 1 runtime failure, 2 bad flags.
int RunGenerateCommand(int argc, const char* const* argv);

}  // namespace kvserve::cli
