#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "server/status_mapping.h"

namespace kvserve::server {
namespace {

// How long an HTTP worker waits for a delta before checking that its client
// is still there.
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

// Hands deltas from the StreamState sink (engine thread, must not block) to
// the HTTP worker thread that waits for them. The StreamState protocol
// keeps at most one delta outstanding until Ack, so one slot suffices.
class DeltaChannel {
 public:
  void Put(engine::StreamDelta delta) {
    absl::MutexLock lock(&mu_);
    slot_ = std::move(delta);
  }
  // The next delta, or nullopt after `timeout`.
  std::optional<engine::StreamDelta> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::optional<engine::StreamDelta>* s) {
                               return s->has_value();
                             },
                             &slot_),
                         timeout);
    std::optional<engine::StreamDelta> out = std::move(slot_);
    slot_.reset();
    return out;
  }

 private:
  absl::Mutex mu_;
  std::optional<engine::StreamDelta> slot_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<DeltaChannel> AttachChannel(engine::StreamState& stream) {
  auto channel = std::make_shared<DeltaChannel>();
  stream.Attach(
      [channel](engine::StreamDelta d) { channel->Put(std::move(d)); });
  return channel;
}

void SendError(const absl::Status& status, httplib::Response& res) {
  const HttpError e = ToHttpError(status);
  res.status = e.http_status;
  res.set_content(e.body, "application/json");
}

// Appends `d` to `out` (everything but the final reason and usage).
void Accumulate(engine::StreamDelta& d, OpenAiResult* out) {
  absl::StrAppend(&out->text, d.text);
  for (engine::TokenLogprobs& lp : d.logprobs) {
    out->logprobs.push_back(std::move(lp));
  }
}

ServedModel MakeServedModel(const engine::Engine& engine) {
  ServedModel m;
  m.tokenizer = &engine.tokenizer();
  m.chat_format = engine.model().chat_format;
  m.chat_template = engine.model().chat_template;
  m.max_context = engine.model_info().max_context;
  return m;
}

}  // namespace

OpenAiApi::OpenAiApi(engine::Engine* engine, RequestLimits limits,
                     std::string model_name, std::string alias)
    : engine_(engine),
      limits_(limits),
      model_name_(std::move(model_name)),
      alias_(std::move(alias)),
      created_(absl::ToUnixSeconds(absl::Now())),
      model_(MakeServedModel(*engine)) {}

void OpenAiApi::Mount(httplib::Server* server, std::function<OpenAiApi*()> api,
                      int http_threads) {
  // A /v1 call holds its worker until its response ends (a stream: when
  // the response object goes, releasing `slot`).
  const int reserved = std::clamp(http_threads / 4, 1, 4);
  const int max_busy =
      http_threads > 0 ? std::max(1, http_threads - reserved) : 1 << 30;
  auto busy = std::make_shared<std::atomic<int>>(0);
  auto with_api = [api, busy, max_busy](auto handler) {
    return [api, handler, busy, max_busy](const httplib::Request& req,
                                          httplib::Response& res) {
      OpenAiApi* self = api();
      if (self == nullptr) {
        SendError(absl::UnavailableError("the model is still loading"), res);
        return;
      }
      if (busy->fetch_add(1) >= max_busy) {
        busy->fetch_sub(1);
        SendError(absl::ResourceExhaustedError(absl::StrFormat(
                      "HTTP server busy: %d API calls in progress, the most "
                      "--http-threads allows while keeping workers for "
                      "/health (raise --http-threads)",
                      max_busy)),
                  res);
        return;
      }
      std::shared_ptr<void> slot(nullptr,
                                 [busy](void*) { busy->fetch_sub(1); });
      handler(self, req, res);
      if (res.content_provider_) {
        res.content_provider_resource_releaser_ =
            [release = std::move(res.content_provider_resource_releaser_),
             slot](bool success) {
              if (release) release(success);
            };
      }
    };
  };
  server->Post("/v1/completions",
               with_api([](OpenAiApi* self, const httplib::Request& req,
                           httplib::Response& res) {
                 self->HandleGenerate(req, res, OpenAiEndpoint::kCompletions);
               }));
  server->Post("/v1/chat/completions",
               with_api([](OpenAiApi* self, const httplib::Request& req,
                           httplib::Response& res) {
                 self->HandleGenerate(req, res,
                                      OpenAiEndpoint::kChatCompletions);
               }));
  server->Get(
      "/v1/models",
      with_api([](OpenAiApi* self, const httplib::Request&,
                  httplib::Response& res) { self->HandleModels(res); }));
  // Unknown /v1 routes (and wrong methods) answer in the OpenAI shape.
  server->set_error_handler(
      [](const httplib::Request& req, httplib::Response& res) {
        if (res.status == 404 && res.body.empty() &&
            req.path.rfind("/v1/", 0) == 0) {
          SendError(absl::NotFoundError(absl::StrCat(
                        "unknown route ", req.method, " ", req.path)),
                    res);
        }
      });
}

void OpenAiApi::HandleModels(httplib::Response& res) const {
  res.set_content(ModelsBody(model_name_, created_), "application/json");
}

absl::StatusOr<engine::RequestSpec> OpenAiApi::BuildSpec(
    const OpenAiRequest& request) const {
  if (!request.model.empty() && request.model != model_name_ &&
      (alias_.empty() || request.model != alias_)) {
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

void OpenAiApi::HandleGenerate(const httplib::Request& req,
                               httplib::Response& res,
                               OpenAiEndpoint endpoint) {
  absl::StatusOr<OpenAiRequest> request =
      ParseOpenAiRequest(req.body, endpoint);
  absl::StatusOr<engine::RequestSpec> spec =
      request.ok() ? BuildSpec(*request) : request.status();
  absl::StatusOr<std::shared_ptr<engine::StreamState>> stream =
      spec.ok() ? engine_->Submit(*std::move(spec)) : spec.status();
  if (!stream.ok()) {
    SendError(stream.status(), res);
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
    StreamResponse(call, *std::move(stream), res);
  } else {
    Respond(call, *std::move(stream), res);
  }
}

absl::Status OpenAiApi::FinishStatusOf(const engine::StreamDelta& d) const {
  return FinishStatus(d.finish_reason, d.error, engine_->draining());
}

// Non-streaming: this HTTP worker waits for the whole output.
void OpenAiApi::Respond(const OpenAiCallInfo& call,
                        std::shared_ptr<engine::StreamState> stream,
                        httplib::Response& res) {
  std::shared_ptr<DeltaChannel> channel = AttachChannel(*stream);
  std::vector<OpenAiResult> results(stream->n());
  engine::Usage usage;
  for (;;) {
    std::optional<engine::StreamDelta> d = channel->Take(kPollInterval);
    if (!d.has_value()) continue;
    OpenAiResult& result = results.at(d->index);
    Accumulate(*d, &result);
    if (d->index_finished) result.finish_reason = d->finish_reason;
    if (d->finished) {
      usage = d->usage;
      if (absl::Status s = FinishStatusOf(*d); !s.ok()) {
        SendError(s, res);
        return;
      }
      break;
    }
    stream->Ack();
  }
  res.set_content(CompletionBody(call, results, usage, *model_.tokenizer),
                  "application/json");
}

// Streaming: httplib calls the provider on this request's worker thread
// until it calls sink.done() or fails; each call waits for one delta and
// writes its events. A failed write or a closed connection aborts the
// request; the releaser aborts it too if the response ended early.
void OpenAiApi::StreamResponse(const OpenAiCallInfo& call,
                               std::shared_ptr<engine::StreamState> stream,
                               httplib::Response& res) {
  std::shared_ptr<DeltaChannel> channel = AttachChannel(*stream);
  // Per completion index: no delta written yet (chat's role chunk).
  auto first = std::make_shared<std::vector<bool>>(stream->n(), true);
  engine::Engine* engine = engine_;
  const models::Tokenizer* tokenizer = model_.tokenizer;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, call, stream, channel, first, tokenizer](size_t,
                                                      httplib::DataSink& sink) {
        std::optional<engine::StreamDelta> d = channel->Take(kPollInterval);
        if (!d.has_value()) return sink.is_writable();
        const absl::Status status =
            d->finished ? FinishStatusOf(*d) : absl::OkStatus();
        const std::string events =
            StreamEvents(call, *d, first->at(d->index), *tokenizer, status);
        first->at(d->index) = false;
        if (!events.empty() && !sink.write(events.data(), events.size())) {
          return false;
        }
        if (d->finished) {
          sink.done();
        } else {
          stream->Ack();
        }
        return true;
      },
      [engine, stream](bool /*success*/) {
        if (!stream->Done()) engine->Abort(stream->id());
      });
}

}  // namespace kvserve::server
