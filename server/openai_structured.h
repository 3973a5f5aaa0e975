// The structured-output fields of an OpenAI-style body, as the proto's
// StructuredOutput: OpenAI's response_format ({"type": "json_object"},
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}),
// vLLM's structured_outputs ({"json" | "regex" | "choice" | "grammar" |
// "json_object" | "structural_tag": ...}) and its older guided_json,
// guided_regex, guided_choice, guided_grammar (guided_decoding_backend
// "xgrammar" or "auto", the engine kvserve has). At most one of them per
// request. Errors are INVALID_ARGUMENT field errors with the body's names.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "kvserve/v1/kvserve.pb.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {

// Sets out->structured_output from `body` when it asks for one, and
// `*field` to the body's path of it ("response_format.json_schema.schema",
// "guided_json", "structured_outputs.regex", ...), for the errors of its
// compile.
// `body` is parsed with its objects' key order kept (a schema's properties
// are generated in that order).
[[nodiscard]] absl::Status ParseStructuredOutput(
    const nlohmann::ordered_json& body, v1::GenerateRequest* out,
    std::string* field);

}  // namespace kvserve::server
