// `kvserve serve` (also `kvserve --model ...`): the serving daemon's
// command line. Owns flag parsing, logging set-up, the signal thread
// (SIGTERM/SIGINT start a drain; handled with sigwait on a dedicated
// thread, never in a signal handler), the start-up line
//   kvserve: listening grpc=HOST:PORT http=HOST:PORT
// (printed to stderr with the bound ports), and the exit code. The daemon's
// parts live in daemon.h.
#pragma once

namespace kvserve::cli {

// argv[1] may be "serve" (flags follow it) or the first flag. Returns the
// process exit code: 0 after a clean drain or --help, 1 when start-up
// fails, 2 for bad flags.
int RunServeCommand(int argc, const char* const* argv);

}  // namespace kvserve::cli
