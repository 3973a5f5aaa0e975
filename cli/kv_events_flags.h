// The serve command's KV event flags (--kv-events-*): where the daemon
// publishes its KV cache events for a router (engine/kv_events.h) and how.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/cli_args.h"
#include "kvevents/publisher.h"

namespace kvserve::cli {

struct KvEventsFlags {
  std::string endpoint;
  std::string replay_endpoint;
  std::string topic;  // empty: kv@<host name>:<HTTP port>@<model name>
  int64_t heartbeat_ms = 1000;
  int64_t buffer_batches = 10000;
  std::string curve_secret_key_file;
  bool private_scopes = false;
};

void RegisterKvEventsFlags(KvEventsFlags* f, CliArgs* args);

// Fills `o` (untouched without --kv-events-endpoint) and, with
// --kv-events-private-scopes, `private_scopes_model` (the topic's model
// part: the relay's engine/kv_events.h). InvalidArgument naming the flag: a
// replay endpoint, topic, key or private scopes without an endpoint, an
// endpoint that is not tcp://, ipc:// or inproc://, an unreadable key file,
// a topic without a model part.
[[nodiscard]] absl::Status ApplyKvEventsFlags(
    const KvEventsFlags& f, const std::string& model_name, int64_t http_port,
    kvevents::PublisherOptions* o, std::string* private_scopes_model);

}  // namespace kvserve::cli
