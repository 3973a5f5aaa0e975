#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/served_model.h"
#include "server/status_mapping.h"

namespace kvserve::server {
namespace {

void SendError(const absl::Status& status, HttpExchange& ex) {
  const HttpError e = ToHttpError(status);
  HttpResponse r;
  r.status = e.http_status;
  r.body = e.body;
  // A full queue or a draining server: the client may try again (a drain
  // sends it elsewhere behind a load balancer).
  if (r.status == 429 || r.status == 503) {
    r.headers.emplace_back("Retry-After", "1");
  }
  ex.Respond(std::move(r));
}

// Aborts the request when the client goes away before its end.
void AbortOnClose(engine::Engine* engine,
                  const std::shared_ptr<engine::StreamState>& stream,
                  HttpExchange& ex) {
  ex.OnClose([engine, stream] {
    if (!stream->Done()) engine->Abort(stream->id());
  });
}

// Appends `d` to `out` (everything but the final reason and usage).
void Accumulate(engine::StreamDelta& d, OpenAiResult* out) {
  absl::StrAppend(&out->text, d.text);
  for (engine::TokenLogprobs& lp : d.logprobs) {
    out->logprobs.push_back(std::move(lp));
  }
}

}  // namespace

OpenAiApi::OpenAiApi(engine::Engine* engine, RequestLimits limits,
                     std::string model_name, std::vector<std::string> aliases)
    : engine_(engine),
      limits_(limits),
      model_name_(std::move(model_name)),
      aliases_(std::move(aliases)),
      created_(absl::ToUnixSeconds(absl::Now())),
      model_(ServedModelOf(*engine)) {}

void OpenAiApi::Mount(HttpRoutes& routes, std::function<OpenAiApi*()> api) {
  auto with_api = [api](auto handler) {
    return [api, handler](std::shared_ptr<HttpExchange> ex) {
      OpenAiApi* self = api();
      if (self == nullptr) {
        SendError(absl::UnavailableError("the model is still loading"), *ex);
        return;
      }
      handler(self, std::move(ex));
    };
  };
  routes.Add("POST", "/v1/completions",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleGenerate(std::move(ex),
                                    OpenAiEndpoint::kCompletions);
             }));
  routes.Add("POST", "/v1/chat/completions",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleGenerate(std::move(ex),
                                    OpenAiEndpoint::kChatCompletions);
             }));
  routes.Add("GET", "/v1/models",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleModels(*ex);
             }));
  // Unknown /v1 routes answer in the OpenAI shape.
  routes.SetFallback([](std::shared_ptr<HttpExchange> ex) {
    const HttpRequest& r = ex->request();
    if (r.path.rfind("/v1/", 0) == 0) {
      SendError(absl::NotFoundError(
                    absl::StrCat("unknown route ", r.method, " ", r.path)),
                *ex);
      return;
    }
    HttpResponse res;
    res.status = 404;
    res.content_type = "text/plain";
    res.body = "not found\n";
    ex->Respond(std::move(res));
  });
}

void OpenAiApi::HandleModels(HttpExchange& ex) const {
  HttpResponse r;
  r.body = ModelsBody(model_name_, created_, engine_->model_info());
  ex.Respond(std::move(r));
}

absl::StatusOr<engine::RequestSpec> OpenAiApi::BuildSpec(
    const OpenAiRequest& request) const {
  if (!request.model.empty() && request.model != model_name_ &&
      std::find(aliases_.begin(), aliases_.end(), request.model) ==
          aliases_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("model: '%s' is not served here (this server serves "
                        "'%s')",
                        request.model, model_name_));
  }
  absl::StatusOr<engine::RequestSpec> spec =
      ToRequestSpec(request.generate, model_,
                    absl::Uniform<uint64_t>(absl::BitGen()), limits_);
  if (!spec.ok()) return ToOpenAiFieldNames(spec.status(), request.endpoint);
  return spec;
}

void OpenAiApi::HandleGenerate(std::shared_ptr<HttpExchange> ex,
                               OpenAiEndpoint endpoint) {
  absl::StatusOr<OpenAiRequest> request =
      ParseOpenAiRequest(ex->request().body, endpoint);
  absl::StatusOr<engine::RequestSpec> spec =
      request.ok() ? BuildSpec(*request) : request.status();
  const bool valid = spec.ok();
  absl::StatusOr<std::shared_ptr<engine::StreamState>> stream =
      valid ? engine_->Submit(*std::move(spec)) : spec.status();
  if (!stream.ok()) {
    // The engine's errors name RequestSpec fields.
    SendError(
        valid ? ToOpenAiFieldNames(ToProtoFieldNames(stream.status()), endpoint)
              : stream.status(),
        *ex);
    return;
  }
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  OpenAiCallInfo call;
  call.endpoint = endpoint;
  call.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", (*stream)->id(), "-",
                         next_id_.fetch_add(1));
  call.created = absl::ToUnixSeconds(absl::Now());
  call.model = model_name_;
  call.logprobs = request->logprobs;
  call.top_logprobs = request->top_logprobs;
  call.include_usage = request->include_usage;
  if (request->stream) {
    StreamResponse(call, *std::move(stream), std::move(ex));
  } else {
    Respond(call, *std::move(stream), std::move(ex));
  }
}

// Non-streaming: the sink (engine thread) collects every delta and acks it
// at once; the final one queues the answer on the connection's strand.
void OpenAiApi::Respond(const OpenAiCallInfo& call,
                        std::shared_ptr<engine::StreamState> stream,
                        std::shared_ptr<HttpExchange> ex) {
  AbortOnClose(engine_, stream, *ex);
  auto results = std::make_shared<std::vector<OpenAiResult>>(stream->n());
  std::weak_ptr<engine::StreamState> weak = stream;
  // NOTE: the callbacks capture the engine and its tokenizer, never `this`:
  // they may run after the API object is gone (the engine outlives it).
  engine::Engine* engine = engine_;
  const models::Tokenizer* tokenizer = model_.tokenizer;
  stream->Attach(
      [engine, tokenizer, call, ex, results, weak](engine::StreamDelta d) {
        OpenAiResult& result = results->at(d.index);
        Accumulate(d, &result);
        if (d.index_finished) result.finish_reason = d.finish_reason;
        if (!d.finished) {
          // Alive: it is calling us. Ack may deliver the next delta
          // re-entrantly (at most one per completion index is pending).
          if (std::shared_ptr<engine::StreamState> s = weak.lock()) s->Ack();
          return;
        }
        if (absl::Status s =
                FinishStatus(d.finish_reason, d.error, engine->draining());
            !s.ok()) {
          SendError(s, *ex);
          return;
        }
        ex->Run([tokenizer, call, ex, results, usage = d.usage] {
          HttpResponse r;
          r.body = CompletionBody(call, *results, usage, *tokenizer);
          ex->Respond(std::move(r));
        });
      });
}

// Streaming: the sink (engine thread) hands each delta to the connection's
// strand, which formats its events and writes them; the stream is acked
// only once they are written, so a slow client holds back its own deltas
// (they coalesce in the StreamState) and nothing else. A failed write or a
// closed connection aborts the request.
void OpenAiApi::StreamResponse(const OpenAiCallInfo& call,
                               std::shared_ptr<engine::StreamState> stream,
                               std::shared_ptr<HttpExchange> ex) {
  AbortOnClose(engine_, stream, *ex);
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.headers.emplace_back("Cache-Control", "no-cache");
  ex->StartStream(std::move(head));
  // Per completion index: no delta written yet (chat's role chunk).
  auto first = std::make_shared<std::vector<bool>>(stream->n(), true);
  std::weak_ptr<engine::StreamState> weak = stream;
  engine::Engine* engine = engine_;  // not `this`: see Respond
  const models::Tokenizer* tokenizer = model_.tokenizer;
  stream->Attach(
      [engine, tokenizer, call, ex, first, weak](engine::StreamDelta d) {
        std::shared_ptr<engine::StreamState> s = weak.lock();
        if (s == nullptr) return;
        ex->Run([engine, tokenizer, call, ex, first, s, d = std::move(d)] {
          const absl::Status status =
              d.finished
                  ? FinishStatus(d.finish_reason, d.error, engine->draining())
                  : absl::OkStatus();
          std::string events =
              StreamEvents(call, d, first->at(d.index), *tokenizer, status);
          first->at(d.index) = false;
          const bool finished = d.finished;
          ex->Write(std::move(events), [s, finished](bool ok) {
            if (ok && !finished) s->Ack();
          });
          if (finished) ex->EndStream();
        });
      });
}

}  // namespace kvserve::server
