// Shared by the two HTTP library prototypes (tools/http_proto/): flags and
// the synthetic SSE event both servers stream, so the load test compares
// the libraries and nothing else. Not part of kvserve.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace http_proto {

struct Config {
  int port = 0;       // 0 = pick a free one
  int threads = 1;    // server threads (pool size / io_context runners)
  int chunks = 8;     // events per stream before [DONE]
  int delay_ms = 50;  // gap between events (a token's decode time)
};

inline Config ParseFlags(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int v = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--port"))
      c.port = v;
    else if (!std::strcmp(argv[i], "--threads"))
      c.threads = v;
    else if (!std::strcmp(argv[i], "--chunks"))
      c.chunks = v;
    else if (!std::strcmp(argv[i], "--delay-ms"))
      c.delay_ms = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  if (c.threads < 1 || c.chunks < 0 || c.delay_ms < 0) {
    std::fprintf(stderr, "--threads >= 1, --chunks >= 0, --delay-ms >= 0\n");
    std::exit(2);
  }
  return c;
}

// One text_completion chunk shaped like kvserve's (about 190 bytes).
inline std::string Event(int i) {
  return "data: {\"id\":\"cmpl-proto\",\"object\":\"text_completion\","
         "\"created\":1764400000,\"model\":\"proto\",\"choices\":[{\"index\":0,"
         "\"text\":\" tok" +
         std::to_string(i) +
         "\",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
}

inline const char* kDone = "data: [DONE]\n\n";

}  // namespace http_proto
