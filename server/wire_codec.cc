#include "server/wire_codec.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "server/request_validation.h"

namespace kvserve::server {
namespace {

namespace pb = google::protobuf;

// Turns every string field of `msg` (and nested messages) into bytes.
void StringsToBytes(pb::DescriptorProto* msg) {
  for (pb::FieldDescriptorProto& f : *msg->mutable_field()) {
    if (f.type() == pb::FieldDescriptorProto::TYPE_STRING) {
      f.set_type(pb::FieldDescriptorProto::TYPE_BYTES);
    }
  }
  for (pb::DescriptorProto& nested : *msg->mutable_nested_type()) {
    StringsToBytes(&nested);
  }
}

std::string FieldPath(const std::string& prefix, const pb::FieldDescriptor* f,
                      int index) {
  std::string path =
      prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
  if (index >= 0) absl::StrAppend(&path, "[", index, "]");
  return path;
}

// Depth-first search of `lenient` (a bytes-for-strings twin of `strict`).
std::string FindInMessage(const pb::Message& lenient,
                          const pb::Descriptor* strict,
                          const std::string& prefix) {
  const pb::Reflection* r = lenient.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(lenient, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const pb::FieldDescriptor* sf = strict->FindFieldByNumber(f->number());
    if (sf == nullptr) continue;
    const int n = f->is_repeated() ? r->FieldSize(lenient, f) : 1;
    for (int i = 0; i < n; ++i) {
      const int index = f->is_repeated() ? i : -1;
      if (sf->type() == pb::FieldDescriptor::TYPE_STRING) {
        const std::string value = f->is_repeated()
                                      ? r->GetRepeatedString(lenient, f, i)
                                      : r->GetString(lenient, f);
        if (!IsValidUtf8(value)) return FieldPath(prefix, sf, index);
      } else if (sf->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
        const pb::Message& sub = f->is_repeated()
                                     ? r->GetRepeatedMessage(lenient, f, i)
                                     : r->GetMessage(lenient, f);
        std::string found = FindInMessage(sub, sf->message_type(),
                                          FieldPath(prefix, sf, index));
        if (!found.empty()) return found;
      }
    }
  }
  return "";
}

}  // namespace

std::string FindInvalidUtf8Field(std::string_view wire,
                                 const pb::Descriptor* descriptor) {
  // NOTE: a self-contained twin of the descriptor's file; our protos import
  // nothing, so a file with imports simply yields "" (a generic error).
  pb::FileDescriptorProto file;
  descriptor->file()->CopyTo(&file);
  if (file.dependency_size() > 0) return "";
  for (pb::DescriptorProto& msg : *file.mutable_message_type()) {
    StringsToBytes(&msg);
  }
  pb::DescriptorPool pool;
  const pb::FileDescriptor* twin_file = pool.BuildFile(file);
  if (twin_file == nullptr) return "";
  const pb::Descriptor* twin =
      pool.FindMessageTypeByName(descriptor->full_name());
  if (twin == nullptr) return "";
  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> lenient(factory.GetPrototype(twin)->New());
  if (!lenient->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return "";
  }
  return FindInMessage(*lenient, descriptor, "");
}

absl::Status ParseRequest(const grpc::ByteBuffer& buffer, pb::Message* msg) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("request: unreadable message");
  }
  std::string wire;
  wire.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  bool parsed;
  {
    // NOTE: protobuf logs an ERROR line for each string with invalid UTF-8;
    // the client gets INVALID_ARGUMENT instead, and must not be able to
    // flood the server's log.
    google::protobuf::LogSilencer silence;
    parsed = msg->ParseFromString(wire);
  }
  if (parsed) return absl::OkStatus();
  const std::string field = FindInvalidUtf8Field(wire, msg->GetDescriptor());
  if (!field.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": invalid UTF-8 (string fields must be UTF-8)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "request: not a valid ", msg->GetDescriptor()->full_name(), " message"));
}

absl::Status SerializeResponse(const pb::Message& msg, grpc::ByteBuffer* out) {
  out->Clear();  // the serializer wants an empty buffer
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<pb::Message>::Serialize(msg, out, &own_buffer);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("serializing ",
                                            msg.GetDescriptor()->full_name(),
                                            ": ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::server
