#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/kv_state.h"
#include "server/kv_blocks.h"
#include "server/kv_purge.h"
#include "server/kv_state_json.h"
#include "server/openai_specs.h"
#include "server/openapi/openapi_spec.h"
#include "server/served_model.h"
#include "server/status_mapping.h"
#include "server/ui/kv_page.h"

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

// Aborts the requests when the client goes away before their end.
void AbortOnClose(engine::Engine* engine, const Streams& streams,
                  HttpExchange& ex) {
  ex.OnClose([engine, streams] {
    for (const auto& s : streams) {
      if (!s->Done()) engine->Abort(s->id());
    }
  });
}

// Appends `d` to `out` (everything but the final reason and usage).
void Accumulate(engine::StreamDelta& d, OpenAiResult* out) {
  absl::StrAppend(&out->text, d.text);
  out->token_ids.insert(out->token_ids.end(), d.token_ids.begin(),
                        d.token_ids.end());
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
  routes.Add("GET", "/v1/kv/state",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleKvState(*ex);
             }));
  routes.Add("GET", "/v1/kv/blocks",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleKvBlocks(*ex);
             }));
  routes.Add("POST", "/v1/kv/purge",
             with_api([](OpenAiApi* self, std::shared_ptr<HttpExchange> ex) {
               self->HandleKvPurge(*ex);
             }));
  // The KV page: static, holds no data (what it shows needs the token).
  routes.Add("GET", "/ui", [](std::shared_ptr<HttpExchange> ex) {
    HttpResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = std::string(KvPageHtml());
    r.headers.emplace_back("Content-Security-Policy", std::string(kKvPageCsp));
    r.headers.emplace_back("X-Content-Type-Options", "nosniff");
    ex->Respond(std::move(r));
  });
  // The API's own description (server/openapi/openapi.json).
  routes.Add("GET", "/openapi.json", [](std::shared_ptr<HttpExchange> ex) {
    HttpResponse r;
    r.body = std::string(OpenApiSpec());
    ex->Respond(std::move(r));
  });
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

void OpenAiApi::HandleKvState(HttpExchange& ex) const {
  std::shared_ptr<const engine::KvState> state = engine_->KvStateSnapshot();
  if (state == nullptr) {
    SendError(absl::UnavailableError("the KV state is not collected yet"), ex);
    return;
  }
  // A tenant sees its own requests; an admin (or the single tenant of a
  // daemon without tokens) sees everyone's.
  const TenantRef& tenant = ex.request().tenant;
  HttpResponse r;
  r.body =
      KvStateJson(*state, model_name_,
                  tenant == nullptr || tenant->admin ? nullptr : &tenant->name);
  r.headers.emplace_back("Cache-Control", "no-store");
  ex.Respond(std::move(r));
}

namespace {

// Admin routes: false (a 403 sent) unless the caller may use `route`: an
// admin token, or a daemon without tokens.
bool RequireAdmin(HttpExchange& ex, absl::string_view route) {
  const TenantRef& tenant = ex.request().tenant;
  if (tenant == nullptr || tenant->admin) return true;
  SendError(absl::PermissionDeniedError(
                absl::StrCat(route, ": an admin token is required")),
            ex);
  return false;
}

// A JSON answer that no cache keeps (it shows the KV state of the moment).
void RespondNoStore(HttpExchange& ex, std::string body) {
  HttpResponse r;
  r.body = std::move(body);
  r.headers.emplace_back("Cache-Control", "no-store");
  ex.Respond(std::move(r));
}

}  // namespace

void OpenAiApi::HandleKvPurge(HttpExchange& ex) const {
  if (!RequireAdmin(ex, "POST /v1/kv/purge")) return;
  absl::StatusOr<KvPurgeRequest> req = ParseKvPurge(ex.request().body);
  if (!req.ok()) {
    SendError(req.status(), ex);
    return;
  }
  absl::StatusOr<engine::KvTierPurge> done =
      engine_->PurgeKvTiers(req->cache_scope, req->cache_salt);
  if (!done.ok()) {
    SendError(done.status(), ex);
    return;
  }
  RespondNoStore(ex, KvPurgeJson(*done));
}

void OpenAiApi::HandleKvBlocks(HttpExchange& ex) const {
  if (!RequireAdmin(ex, "GET /v1/kv/blocks")) return;
  absl::StatusOr<engine::ResidentBlocks> blocks =
      engine_->KvEventResidentBlocks(absl::Seconds(5));
  if (!blocks.ok()) {
    SendError(blocks.status(), ex);
    return;
  }
  RespondNoStore(ex, KvBlocksJson(*blocks));
}

absl::StatusOr<std::vector<engine::RequestSpec>> OpenAiApi::BuildSpecs(
    const OpenAiRequest& request, const Tenant& tenant) const {
  if (!request.model.empty() && request.model != model_name_ &&
      std::find(aliases_.begin(), aliases_.end(), request.model) ==
          aliases_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("model: '%s' is not served here (this server serves "
                        "'%s')",
                        request.model, model_name_));
  }
  return OpenAiSpecs(request, model_, tenant, limits_,
                     absl::Uniform<uint64_t>(absl::BitGen()));
}

void OpenAiApi::HandleGenerate(std::shared_ptr<HttpExchange> ex,
                               OpenAiEndpoint endpoint) {
  absl::StatusOr<OpenAiRequest> request =
      ParseOpenAiRequest(ex->request().body, endpoint);
  static const TenantRef kNoTenant = SingleTenant(TenantDefaults{});
  const TenantRef& tenant =
      ex->request().tenant != nullptr ? ex->request().tenant : kNoTenant;
  absl::StatusOr<std::vector<engine::RequestSpec>> specs =
      request.ok() ? BuildSpecs(*request, *tenant) : request.status();
  if (!specs.ok()) {
    SendError(specs.status(), *ex);
    return;
  }
  Streams streams;
  for (size_t i = 0; i < specs->size(); ++i) {
    absl::StatusOr<std::shared_ptr<engine::StreamState>> stream =
        engine_->Submit(std::move((*specs)[i]));
    if (!stream.ok()) {
      // All or nothing: the prompts already queued are withdrawn.
      for (const auto& s : streams) engine_->Abort(s->id());
      // The engine's errors name RequestSpec paths.
      SendError(
          ClientFieldNames(
              ToProtoFieldNames(stream.status()), *request,
              request->batch.empty() ? std::nullopt : std::optional<size_t>(i)),
          *ex);
      return;
    }
    streams.push_back(*std::move(stream));
  }
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  OpenAiCallInfo call;
  call.endpoint = endpoint;
  call.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", streams[0]->id(), "-",
                         next_id_.fetch_add(1));
  call.created = absl::ToUnixSeconds(absl::Now());
  call.model = model_name_;
  call.logprobs = request->logprobs;
  call.top_logprobs = request->top_logprobs;
  call.include_usage = request->include_usage;
  call.return_token_ids = request->return_token_ids;
  call.tool_calls = request->tool_calls;
  AbortOnClose(engine_, streams, *ex);
  if (request->stream) {
    StreamResponse(call, std::move(streams), std::move(ex));
  } else {
    Respond(call, std::move(streams), std::move(ex));
  }
}

namespace {

// The first choice index of each stream: stream i's completion j is choice
// offsets[i] + j (prompt-major, as OpenAI numbers a batch's choices).
std::vector<int32_t> ChoiceOffsets(const Streams& streams) {
  std::vector<int32_t> offsets;
  int32_t next = 0;
  for (const auto& s : streams) {
    offsets.push_back(next);
    next += s->n();
  }
  return offsets;
}

void AddUsage(const engine::Usage& u, engine::Usage* sum) {
  sum->prompt_tokens += u.prompt_tokens;
  sum->completion_tokens += u.completion_tokens;
  sum->cached_prompt_tokens += u.cached_prompt_tokens;
  engine::AddKvUsage(u.kv, &sum->kv);
}

// What the sinks of one non-streaming call share; they run on the engine
// thread or on an Attach/Ack caller's, hence the lock.
struct Collected {
  absl::Mutex mu;
  std::vector<OpenAiResult> results ABSL_GUARDED_BY(mu);
  engine::Usage usage ABSL_GUARDED_BY(mu);
  size_t open ABSL_GUARDED_BY(mu) = 0;  // streams not finished
  bool failed ABSL_GUARDED_BY(mu) = false;
};

// What the strand-run writers of one streaming call share (strand only).
struct Streamed {
  std::vector<bool> first;  // per choice: nothing written yet
  // Per choice, with tools: the parser of its output into tool calls.
  std::vector<ToolCallStream> tools;
  engine::Usage usage;
  size_t open = 0;  // streams not finished
  bool ended = false;
};

}  // namespace

// Non-streaming: each sink (engine thread) collects its deltas and acks
// them at once; the last stream to finish queues the answer on the
// connection's strand. A failed stream answers the error and withdraws the
// others.
void OpenAiApi::Respond(const OpenAiCallInfo& call, Streams streams,
                        std::shared_ptr<HttpExchange> ex) {
  const std::vector<int32_t> offsets = ChoiceOffsets(streams);
  auto c = std::make_shared<Collected>();
  {
    absl::MutexLock lock(&c->mu);
    c->results.resize(offsets.back() + streams.back()->n());
    c->open = streams.size();
  }
  // NOTE: the callbacks capture the engine and its tokenizer, never `this`:
  // they may run after the API object is gone (the engine outlives it).
  engine::Engine* engine = engine_;
  const models::Tokenizer* tokenizer = model_.tokenizer;
  std::vector<engine::RequestId> ids;
  for (const auto& s : streams) ids.push_back(s->id());
  for (size_t i = 0; i < streams.size(); ++i) {
    std::weak_ptr<engine::StreamState> weak = streams[i];
    const int32_t offset = offsets[i];
    streams[i]->Attach([engine, tokenizer, call, ex, c, weak, offset,
                        ids](engine::StreamDelta d) {
      absl::Status error;
      bool last = false;
      {
        absl::MutexLock lock(&c->mu);
        OpenAiResult& result = c->results.at(offset + d.index);
        Accumulate(d, &result);
        if (d.index_finished) result.finish_reason = d.finish_reason;
        if (d.finished && !c->failed) {
          error = FinishStatus(d.finish_reason, d.error, engine->draining());
          c->failed = !error.ok();
          AddUsage(d.usage, &c->usage);
          last = --c->open == 0 && error.ok();
        }
      }
      if (!d.finished) {
        // Alive: it is calling us. Ack may deliver the next delta
        // re-entrantly (at most one per completion index is pending).
        if (std::shared_ptr<engine::StreamState> s = weak.lock()) s->Ack();
        return;
      }
      if (!error.ok()) {
        for (engine::RequestId id : ids) engine->Abort(id);
        SendError(error, *ex);
        return;
      }
      if (!last) return;
      ex->Run([tokenizer, call, ex, c] {
        absl::MutexLock lock(&c->mu);
        HttpResponse r;
        r.body = CompletionBody(call, c->results, c->usage, *tokenizer);
        ex->Respond(std::move(r));
      });
    });
  }
}

// Streaming: each sink (engine thread) hands its deltas to the connection's
// strand, which renumbers their choices, formats their events and writes
// them; a stream is acked only once they are written, so a slow client
// holds back its own deltas (they coalesce in the StreamState) and nothing
// else. The usage chunk and [DONE] follow the last stream's end. A failed
// write or a closed connection aborts the requests; a failed request ends
// the response with its error and withdraws the others.
void OpenAiApi::StreamResponse(const OpenAiCallInfo& call, Streams streams,
                               std::shared_ptr<HttpExchange> ex) {
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.headers.emplace_back("Cache-Control", "no-cache");
  ex->StartStream(std::move(head));
  const std::vector<int32_t> offsets = ChoiceOffsets(streams);
  auto shared = std::make_shared<Streamed>();
  shared->first.assign(offsets.back() + streams.back()->n(), true);
  if (call.tool_calls) {
    for (size_t i = 0; i < shared->first.size(); ++i) {
      shared->tools.emplace_back(absl::StrCat("call_", call.id, "_", i, "_"));
    }
  }
  shared->open = streams.size();
  engine::Engine* engine = engine_;  // not `this`: see Respond
  const models::Tokenizer* tokenizer = model_.tokenizer;
  std::vector<engine::RequestId> ids;
  for (const auto& s : streams) ids.push_back(s->id());
  for (size_t i = 0; i < streams.size(); ++i) {
    std::weak_ptr<engine::StreamState> weak = streams[i];
    const int32_t offset = offsets[i];
    streams[i]->Attach([engine, tokenizer, call, ex, shared, weak, offset,
                        ids](engine::StreamDelta d) {
      std::shared_ptr<engine::StreamState> s = weak.lock();
      if (s == nullptr) return;
      ex->Run([engine, tokenizer, call, ex, shared, s, offset, ids,
               d = std::move(d)]() mutable {
        if (shared->ended) return;  // another request failed
        const bool stream_done = d.finished;
        const absl::Status status =
            stream_done
                ? FinishStatus(d.finish_reason, d.error, engine->draining())
                : absl::OkStatus();
        d.index += offset;
        bool end = !status.ok();
        if (stream_done && status.ok()) {
          AddUsage(d.usage, &shared->usage);
          end = --shared->open == 0;
          // Only the last stream's end is the response's.
          d.finished = end;
          d.usage = shared->usage;
        }
        StreamToolCalls tools;
        if (!shared->tools.empty()) {  // the text around the calls
          ToolCallStream& parse = shared->tools.at(d.index);
          tools.first_index = parse.num_calls();
          ToolCallStream::Out out = parse.Feed(d.text);
          if (d.index_finished || d.finished) {
            out.content += parse.Finish().content;
          }
          d.text = std::move(out.content);
          tools.calls = std::move(out.calls);
          tools.any = parse.num_calls() > 0;
        }
        std::string events = StreamEvents(call, d, shared->first.at(d.index),
                                          *tokenizer, status, tools);
        shared->first.at(d.index) = false;
        ex->Write(std::move(events), [s, stream_done](bool ok) {
          if (ok && !stream_done) s->Ack();
        });
        if (!end) return;
        shared->ended = true;
        if (!status.ok()) {
          for (engine::RequestId id : ids) engine->Abort(id);
        }
        ex->EndStream();
      });
    });
  }
}

}  // namespace kvserve::server
