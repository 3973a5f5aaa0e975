// The OpenAI-compatible HTTP API on the daemon's HTTP server:
//   POST /v1/completions       prompt (text or token ids) -> text
//   POST /v1/chat/completions  messages rendered with the model's chat format
//   GET  /v1/models            the served model
//   GET  /v1/kv/state          the KV cache (engine/kv_state.h)
//   GET  /ui                   the page that draws it (server/ui/)
// Both POST routes stream as server-sent events with "stream": true. Owns
// the request lifecycle over HTTP: parse (openai_json.h), validate
// (request_validation.h), Submit, collect or stream the deltas, and Abort
// when the client goes away. Does not own the HTTP server, the engine, or
// the JSON shapes (openai_json.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/openai_json.h"
#include "server/request_validation.h"

namespace kvserve::server {

// The requests of one API call: one per prompt of a batch.
using Streams = std::vector<std::shared_ptr<engine::StreamState>>;

class OpenAiApi {
 public:
  // `engine` must outlive this. `model_name` is the id /v1/models lists and
  // responses carry; requests whose "model" is neither it nor one of
  // `aliases` get 404.
  OpenAiApi(engine::Engine* engine, RequestLimits limits,
            std::string model_name, std::vector<std::string> aliases = {});
  OpenAiApi(const OpenAiApi&) = delete;
  OpenAiApi& operator=(const OpenAiApi&) = delete;

  // Registers the /v1 routes (before the server listens); unknown /v1
  // routes answer 404 in the OpenAI error shape. `api` returns the live
  // instance, or null while the model loads (503). Handlers never block:
  // deltas reach the client through the exchange as the engine makes them.
  static void Mount(HttpRoutes& routes, std::function<OpenAiApi*()> api);

  const std::string& model_name() const { return model_name_; }

 private:
  void HandleGenerate(std::shared_ptr<HttpExchange> ex,
                      OpenAiEndpoint endpoint);
  void HandleModels(HttpExchange& ex) const;
  // GET /v1/kv/state: the engine's latest KV snapshot.
  void HandleKvState(HttpExchange& ex) const;
  void HandleKvPurge(HttpExchange& ex) const;
  void HandleKvBlocks(HttpExchange& ex) const;
  // One spec per prompt (a batch has several), in prompt order, with
  // `tenant`'s policy applied (openai_specs.h); 404 for another model.
  [[nodiscard]] absl::StatusOr<std::vector<engine::RequestSpec>> BuildSpecs(
      const OpenAiRequest& request, const Tenant& tenant) const;
  void Respond(const OpenAiCallInfo& call, Streams streams,
               std::shared_ptr<HttpExchange> ex);
  void StreamResponse(const OpenAiCallInfo& call, Streams streams,
                      std::shared_ptr<HttpExchange> ex);

  engine::Engine* const engine_;
  const RequestLimits limits_;
  const std::string model_name_;
  const std::vector<std::string> aliases_;
  const int64_t created_;
  ServedModel model_;
  std::atomic<int64_t> next_id_{0};
};

}  // namespace kvserve::server
