#include "server/reflection_v1.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace kvserve::server {
namespace {

namespace pb = google::protobuf;

// Reflection requests name a file, a symbol or a type: a few hundred bytes.
constexpr size_t kMaxRequestBytes = 4096;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// `file` and every file it imports, each once, the requested file first
// (clients such as grpcurl read the first as the answer).
void AddFile(const pb::FileDescriptor* file, std::set<std::string>* seen,
             grpc::reflection::v1::FileDescriptorResponse* out) {
  if (!seen->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFile(file->dependency(i), seen, out);
  }
}

void NotFound(const std::string& what, ServerReflectionResponse* out) {
  out->mutable_error_response()->set_error_code(
      static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  out->mutable_error_response()->set_error_message(what);
}

// One stream: read a request, write its answer, until the client is done.
class Reactor final : public grpc::ServerBidiReactor<ServerReflectionRequest,
                                                     ServerReflectionResponse> {
 public:
  explicit Reactor(const ReflectionV1Service* service) : service_(service) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    response_ = service_->Answer(request_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "write"));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* const service_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

}  // namespace

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new Reactor(this);
}

ServerReflectionResponse ReflectionV1Service::Answer(
    const ServerReflectionRequest& request) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  ServerReflectionResponse out;
  // Reflection is open (no token): an oversized request is answered with
  // an error that does not echo it.
  if (request.ByteSizeLong() > kMaxRequestBytes) {
    out.mutable_error_response()->set_error_code(
        static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    out.mutable_error_response()->set_error_message(absl::StrCat(
        "request: ", request.ByteSizeLong(), " bytes, over the limit of ",
        kMaxRequestBytes, " for reflection"));
    return out;
  }
  out.set_valid_host(request.host());
  *out.mutable_original_request() = request;
  std::set<std::string> seen;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        out.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case ServerReflectionRequest::kFileByFilename: {
      const pb::FileDescriptor* f =
          pool->FindFileByName(request.file_by_filename());
      if (f == nullptr) {
        NotFound("file not found: " + request.file_by_filename(), &out);
      } else {
        AddFile(f, &seen, out.mutable_file_descriptor_response());
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const pb::FileDescriptor* f =
          pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (f == nullptr) {
        NotFound("symbol not found: " + request.file_containing_symbol(), &out);
      } else {
        AddFile(f, &seen, out.mutable_file_descriptor_response());
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(ext.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr
              ? nullptr
              : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        NotFound("extension not found", &out);
      } else {
        AddFile(field->file(), &seen, out.mutable_file_descriptor_response());
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        NotFound("type not found: " + request.all_extension_numbers_of_type(),
                 &out);
        break;
      }
      std::vector<const pb::FieldDescriptor*> exts;
      pool->FindAllExtensions(type, &exts);
      auto* numbers = out.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* e : exts) {
        numbers->add_extension_number(e->number());
      }
      break;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      out.mutable_error_response()->set_error_code(
          static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
      out.mutable_error_response()->set_error_message(
          "message_request: none set");
      break;
  }
  return out;
}

}  // namespace kvserve::server
