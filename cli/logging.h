// The process-wide spdlog logger of the `kvserve` subcommands that run an
// engine: one stderr logger, so stdout carries only what a command prints
// itself (`generate` writes the generated text there).
#pragma once

#include <string>

namespace kvserve::cli {

// Makes a stderr logger at `level` (an spdlog level name: trace, debug,
// info, warn, error, critical, off) the default logger; a second call sets
// the level of the same logger. Call from the main thread before any other
// thread logs.
void SetUpLogging(const std::string& level);

}  // namespace kvserve::cli
