#include "cli/kv_events_flags.h"

#include <unistd.h>

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/loader/mapped_file.h"

namespace kvserve::cli {

void RegisterKvEventsFlags(KvEventsFlags* f, CliArgs* args) {
  args->String("kv-events-endpoint", &f->endpoint,
               "publish KV cache events (vLLM's ZMQ format, read by llm-d's "
               "precise prefix-cache scorer) on this ZMQ endpoint: a "
               "wildcard host (tcp://*:5557) or ipc:// is bound, any other "
               "host connected to. The events carry prompts' token ids: "
               "bind loopback or a private network (default off)");
  args->String("kv-events-replay-endpoint", &f->replay_endpoint,
               "a ZMQ ROUTER bound here replays buffered event batches from "
               "a sequence number (default off)");
  args->String("kv-events-topic", &f->topic,
               "the events' topic (default kv@<host name>:<HTTP "
               "port>@<model name>; llm-d reads kv@<pod>@<model>)");
  args->Int("kv-events-heartbeat-ms", &f->heartbeat_ms,
            "an empty event batch after this many ms without one (default "
            "1000; 0 = none)",
            0, 3600 * 1000);
  args->Int("kv-events-buffer", &f->buffer_batches,
            "event batches kept for replay (default 10000)", 0, 1 << 24);
  args->String("kv-events-curve-secret-key-file", &f->curve_secret_key_file,
               "a file holding a Z85 CURVE secret key (40 characters): the "
               "event sockets encrypt and accept only clients that know its "
               "public key (default off)");
  args->Bool("kv-events-private-scopes", &f->private_scopes,
             "also announce private cache scopes' blocks (never salted "
             "ones), under the LoRA name <topic model>@<scope>: the router "
             "matches them only for requests it attributes to that name; "
             "the stream then carries those tenants' token ids (default "
             "off)");
}

absl::Status ApplyKvEventsFlags(const KvEventsFlags& f,
                                const std::string& model_name,
                                int64_t http_port,
                                kvevents::PublisherOptions* o,
                                std::string* private_scopes_model) {
  if (f.endpoint.empty()) {
    if (!f.replay_endpoint.empty() || !f.topic.empty() ||
        !f.curve_secret_key_file.empty() || f.private_scopes) {
      return absl::InvalidArgumentError(
          "--kv-events-replay-endpoint, --kv-events-topic, "
          "--kv-events-curve-secret-key-file and --kv-events-private-scopes "
          "need --kv-events-endpoint");
    }
    return absl::OkStatus();
  }
  for (const auto& [flag, value] :
       std::array<std::pair<const char*, const std::string*>, 2>{
           {{"--kv-events-endpoint", &f.endpoint},
            {"--kv-events-replay-endpoint", &f.replay_endpoint}}}) {
    if (value->empty()) continue;
    if (!absl::StartsWith(*value, "tcp://") &&
        !absl::StartsWith(*value, "ipc://") &&
        !absl::StartsWith(*value, "inproc://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " '", *value, "': must be tcp://, ipc:// or inproc://"));
    }
  }
  o->endpoint = f.endpoint;
  o->replay_endpoint = f.replay_endpoint;
  o->heartbeat = absl::Milliseconds(f.heartbeat_ms);
  o->buffer_batches = static_cast<int32_t>(f.buffer_batches);
  o->topic = f.topic;
  if (o->topic.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    o->topic = absl::StrCat("kv@", host, ":", http_port, "@", model_name);
  }
  if (!f.curve_secret_key_file.empty()) {
    absl::StatusOr<std::string> text =
        models::ReadFileToString(f.curve_secret_key_file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-curve-secret-key-file: ", text.status().message()));
    }
    o->curve_secret_key = std::string(
        absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  }
  if (f.private_scopes) {
    // kv@<pod>@<model>: llm-d's model, the root of its keys.
    const size_t at = o->topic.rfind('@');
    if (at == std::string::npos || at + 1 == o->topic.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-events-private-scopes: the topic '", o->topic,
                       "' has no model part (kv@<pod>@<model>)"));
    }
    *private_scopes_model = o->topic.substr(at + 1);
  }
  return absl::OkStatus();
}

}  // namespace kvserve::cli
