#include "common/field_error.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

bool HeadMatches(absl::string_view path, absl::string_view from) {
  if (from.empty() || !absl::StartsWith(path, from)) return false;
  if (from.back() == '.' || path.size() == from.size()) return true;
  const char next = path[from.size()];
  return next == '.' || next == '[';
}

}  // namespace

absl::Status FieldError(absl::StatusCode code, absl::string_view field,
                        absl::string_view problem) {
  absl::Status status(code, absl::StrCat(field, ": ", problem));
  status.SetPayload(kFieldPayloadUrl, absl::Cord(field));
  return status;
}

absl::Status InvalidFieldError(absl::string_view field,
                               absl::string_view problem) {
  return FieldError(absl::StatusCode::kInvalidArgument, field, problem);
}

std::optional<std::string> ErrorField(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayloadUrl);  // absl::optional
  if (!field.has_value()) return std::nullopt;
  return std::string(*field);
}

absl::Status RenameField(const absl::Status& status,
                         absl::string_view new_field) {
  const std::optional<std::string> field = ErrorField(status);
  if (!field.has_value()) return status;
  // The invariant holds for every status FieldError made; a message edited
  // since keeps its text, and the payload still follows the rename.
  const absl::string_view msg = status.message();
  absl::Status renamed(status.code(),
                       absl::StartsWith(msg, *field)
                           ? absl::StrCat(new_field, msg.substr(field->size()))
                           : std::string(msg));
  status.ForEachPayload(
      [&renamed](absl::string_view url, const absl::Cord& value) {
        renamed.SetPayload(url, value);
      });
  renamed.SetPayload(kFieldPayloadUrl, absl::Cord(new_field));
  return renamed;
}

std::string RenamePath(absl::string_view path,
                       absl::Span<const FieldRename> renames) {
  for (const FieldRename& r : renames) {
    if (HeadMatches(path, r.from)) {
      return absl::StrCat(r.to, path.substr(r.from.size()));
    }
  }
  return std::string(path);
}

absl::Status RenameFieldPath(const absl::Status& status,
                             absl::Span<const FieldRename> renames) {
  const std::optional<std::string> field = ErrorField(status);
  if (!field.has_value()) return status;
  return RenameField(status, RenamePath(*field, renames));
}

}  // namespace kvserve
