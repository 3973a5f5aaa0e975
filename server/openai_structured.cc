// OpenAI / vLLM structured-output fields -> StructuredOutput. See
// openai_structured.h.
#include "server/openai_structured.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/field_error.h"
#include "common/status_macros.h"
#include "server/json_field.h"

namespace kvserve::server {
namespace {

// Ordered: a schema keeps its properties in the client's order, which is
// the order the output writes them in.
using json = nlohmann::ordered_json;

// One structured output a request asked for, before the one-of check.
struct Ask {
  std::string field;
  v1::StructuredOutput so;
};

// A schema given as a JSON object, or as a string holding one (vLLM
// accepts both).
absl::Status SchemaText(const json& v, const std::string& field,
                        std::string* out) {
  if (v.is_object()) {
    *out = v.dump();
    return absl::OkStatus();
  }
  if (v.is_string()) {
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  return InvalidFieldError(field, "must be a JSON schema (an object)");
}

absl::Status StringField(const json& v, const std::string& field,
                         std::string* out) {
  if (!v.is_string()) return InvalidFieldError(field, "must be a string");
  *out = v.get<std::string>();
  return absl::OkStatus();
}

absl::Status Choices(const json& v, const std::string& field,
                     v1::Choices* out) {
  if (!v.is_array()) {
    return InvalidFieldError(field, "must be an array of strings");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      return InvalidFieldError(absl::StrCat(field, "[", i, "]"),
                               "must be a string");
    }
    out->add_choices(v[i].get<std::string>());
  }
  return absl::OkStatus();
}

// response_format: "text" asks for nothing.
absl::Status ResponseFormat(const json& body, std::vector<Ask>* asks) {
  const json& f = Field(body, "response_format");
  if (f.is_null()) return absl::OkStatus();
  if (!f.is_object() || !Field(f, "type").is_string()) {
    return InvalidFieldError("response_format.type",
                             "must be \"text\", \"json_object\" or "
                             "\"json_schema\"");
  }
  const std::string type = Field(f, "type").get<std::string>();
  if (type == "text") return absl::OkStatus();
  Ask a;
  if (type == "json_object") {
    a.field = "response_format";
    a.so.set_json_object(true);
  } else if (type == "json_schema") {
    const json& js = Field(f, "json_schema");
    if (!js.is_object()) {
      return InvalidFieldError("response_format.json_schema",
                               "must be an object with a \"schema\"");
    }
    const json& strict = Field(js, "strict");
    if (!strict.is_null() && !strict.is_boolean()) {
      return InvalidFieldError("response_format.json_schema.strict",
                               "must be a boolean");
    }
    const json& name = Field(js, "name");
    if (!name.is_null() && !name.is_string()) {
      return InvalidFieldError("response_format.json_schema.name",
                               "must be a string");
    }
    a.field = "response_format.json_schema.schema";
    const json& schema = Field(js, "schema");
    if (schema.is_null()) {
      return InvalidFieldError(a.field, "missing (the JSON schema)");
    }
    KV_RETURN_IF_ERROR(SchemaText(schema, a.field, a.so.mutable_json_schema()));
  } else {
    return InvalidFieldError(
        "response_format.type",
        absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", "
                     "got \"",
                     type, "\""));
  }
  asks->push_back(std::move(a));
  return absl::OkStatus();
}

// One key of vLLM's structured_outputs / guided_* (`key` its kind).
absl::Status VllmKind(const json& v, const std::string& field,
                      const std::string& key, std::vector<Ask>* asks) {
  Ask a;
  a.field = field;
  if (key == "json") {
    KV_RETURN_IF_ERROR(SchemaText(v, field, a.so.mutable_json_schema()));
  } else if (key == "regex") {
    KV_RETURN_IF_ERROR(StringField(v, field, a.so.mutable_regex()));
  } else if (key == "choice") {
    KV_RETURN_IF_ERROR(Choices(v, field, a.so.mutable_choice()));
  } else if (key == "grammar") {
    KV_RETURN_IF_ERROR(StringField(v, field, a.so.mutable_grammar()));
  } else if (key == "json_object") {
    if (!v.is_boolean()) return InvalidFieldError(field, "must be a boolean");
    if (!v.get<bool>()) return absl::OkStatus();
    a.so.set_json_object(true);
  } else if (key == "structural_tag") {
    std::string tag;
    if (v.is_object()) {
      tag = v.dump();
    } else {
      KV_RETURN_IF_ERROR(StringField(v, field, &tag));
    }
    a.so.set_structural_tag(std::move(tag));
  } else {
    return InvalidFieldError(field, "is not supported");
  }
  asks->push_back(std::move(a));
  return absl::OkStatus();
}

absl::Status Vllm(const json& body, std::vector<Ask>* asks) {
  const json& so = Field(body, "structured_outputs");
  if (!so.is_null()) {
    if (!so.is_object()) {
      return InvalidFieldError("structured_outputs", "must be an object");
    }
    for (const auto& [key, v] : so.items()) {
      if (v.is_null()) continue;
      KV_RETURN_IF_ERROR(
          VllmKind(v, absl::StrCat("structured_outputs.", key), key, asks));
    }
  }
  for (const char* key : {"json", "regex", "choice", "grammar"}) {
    const std::string name = absl::StrCat("guided_", key);
    const json& v = Field(body, name.c_str());
    if (!v.is_null()) KV_RETURN_IF_ERROR(VllmKind(v, name, key, asks));
  }
  const json& backend = Field(body, "guided_decoding_backend");
  if (!backend.is_null()) {
    if (!backend.is_string() ||
        (backend != "xgrammar" && backend != "auto" && backend != "")) {
      return InvalidFieldError("guided_decoding_backend",
                               "kvserve's backend is \"xgrammar\" (or "
                               "\"auto\")");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseStructuredOutput(const json& body, v1::GenerateRequest* out,
                                   std::string* field) {
  std::vector<Ask> asks;
  KV_RETURN_IF_ERROR(ResponseFormat(body, &asks));
  KV_RETURN_IF_ERROR(Vllm(body, &asks));
  if (asks.empty()) return absl::OkStatus();
  if (asks.size() > 1) {
    return InvalidFieldError(
        asks[1].field, absl::StrCat("only one structured output per request; "
                                    "this one comes after ",
                                    asks[0].field));
  }
  *field = asks[0].field;
  *out->mutable_structured_output() = std::move(asks[0].so);
  return absl::OkStatus();
}

}  // namespace kvserve::server
