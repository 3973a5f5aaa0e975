// The OpenAPI 3.1 description of kvserve's HTTP API
// (server/openapi/openapi.json, compiled into the binary), served at
// /openapi.json and checked against the live daemon by schemathesis
// (tests/server/openapi_conformance_test.py).
#pragma once

#include <string_view>

namespace kvserve::server {

// The JSON text of server/openapi/openapi.json.
[[nodiscard]] std::string_view OpenApiSpec();

}  // namespace kvserve::server
