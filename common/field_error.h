// Field errors: a status about one request field names the field twice, in
// its message ("sampling.top_p: must be in (0, 1], got 1.5") and in a
// payload holding the field's path ("sampling.top_p", "chat.messages[0]
// .role", "sampling.stop_token_ids[3]"). Each front end renders the path in
// its own names (gRPC: the proto's; OpenAI: the JSON body's; the CLI: its
// flags) by RenameField, so no code reads a field back out of message text.
//
// Invariant: a status with the payload has a message that begins with the
// payload's path; RenameField keeps it so. A path is its producer's: the
// validation of a GenerateRequest names proto paths, the engine names
// RequestSpec paths, and whoever renders an error knows which it holds.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvserve {

// The payload's type URL; its value is the field's path.
inline constexpr absl::string_view kFieldPayloadUrl = "type.kvserve.dev/field";

// The status `code` with message "<field>: <problem>", naming `field`.
[[nodiscard]] absl::Status FieldError(absl::StatusCode code,
                                      absl::string_view field,
                                      absl::string_view problem);

// FieldError(kInvalidArgument, ...), the usual kind.
[[nodiscard]] absl::Status InvalidFieldError(absl::string_view field,
                                             absl::string_view problem);

// The path of the field `status` names, or nullopt for a status that names
// none.
[[nodiscard]] std::optional<std::string> ErrorField(const absl::Status& status);

// `status` naming `new_field` instead of its field: the message's leading
// path replaced, the payload updated, code and other payloads kept. A
// status that names no field passes unchanged.
[[nodiscard]] absl::Status RenameField(const absl::Status& status,
                                       absl::string_view new_field);

// One rename of a path's head. `from` matches a path that is `from`, or that
// continues after it with '.' or '[' ("chat" matches "chat.messages[0]", not
// "chatty"); a `from` that ends in '.' matches any path under it ("sampling."
// matches "sampling.top_p", so that {"sampling.", ""} drops the parent).
struct FieldRename {
  absl::string_view from;
  absl::string_view to;
};

// `path` with its head renamed by the first matching entry of `renames` and
// the rest kept ("chat.messages[0].role" by {"chat", "messages"}:
// "messages.messages[0].role"); unchanged when none matches.
[[nodiscard]] std::string RenamePath(absl::string_view path,
                                     absl::Span<const FieldRename> renames);

// `status` with its field renamed by RenamePath; a status that names no
// field passes unchanged.
[[nodiscard]] absl::Status RenameFieldPath(
    const absl::Status& status, absl::Span<const FieldRename> renames);

}  // namespace kvserve
