// The served model as request validation sees it (ServedModel), taken from
// a running engine. Shared by the gRPC service and the OpenAI API.
#pragma once

#include "engine/engine.h"
#include "server/request_validation.h"

namespace kvserve::server {

// The engine's tokenizer (not owned: the engine outlives the services),
// chat format and template, and the longest sequence a request may reach.
[[nodiscard]] ServedModel ServedModelOf(const engine::Engine& engine);

}  // namespace kvserve::server
