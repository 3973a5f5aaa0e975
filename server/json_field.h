// Field: a member of a JSON object, or null when absent, for the parsers of
// request bodies (nlohmann::json and ordered_json alike), so that a missing
// field and an explicit null read the same.
#pragma once

namespace kvserve::server {

template <typename Json>
const Json& Field(const Json& body, const char* name) {
  static const Json* const kNull = new Json(nullptr);
  auto it = body.find(name);
  return it == body.end() ? *kNull : *it;
}

}  // namespace kvserve::server
