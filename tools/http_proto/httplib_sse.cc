// cpp-httplib SSE prototype: POST /v1/completions streams --chunks synthetic
// events --delay-ms apart, as kvserve's OpenAI API does (chunked content
// provider on a pool worker; each open stream holds one worker thread).
#include <chrono>
#include <memory>
#include <thread>

#include "httplib.h"
#include "sse_common.h"

int main(int argc, char** argv) {
  const http_proto::Config cfg = http_proto::ParseFlags(argc, argv);
  httplib::Server svr;
  svr.new_task_queue = [&cfg] { return new httplib::ThreadPool(cfg.threads); };
  svr.Post("/v1/completions", [&cfg](const httplib::Request&,
                                     httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    auto sent = std::make_shared<int>(0);
    res.set_chunked_content_provider(
        "text/event-stream", [sent, &cfg](size_t, httplib::DataSink& sink) {
          if (*sent == cfg.chunks) {
            sink.write(http_proto::kDone, std::strlen(http_proto::kDone));
            sink.done();
            return true;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(cfg.delay_ms));
          const std::string e = http_proto::Event((*sent)++);
          return sink.write(e.data(), e.size());
        });
  });
  const int port = cfg.port == 0 ? svr.bind_to_any_port("127.0.0.1")
                   : svr.bind_to_port("127.0.0.1", cfg.port) ? cfg.port
                                                             : -1;
  if (port <= 0) {
    std::fprintf(stderr, "cannot listen\n");
    return 1;
  }
  std::printf("listening 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  svr.listen_after_bind();
  return 0;
}
