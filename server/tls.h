// TLS for the daemon's two listeners (--tls-cert, --tls-key,
// --tls-client-ca). Owns the start-up checks of the PEM files (readable,
// parseable, the key matches the certificate) so that a bad file fails the
// start with the flag's name instead of failing every handshake later, and
// the credentials each server library takes: grpc::SslServerCredentials for
// gRPC and the set-up of the OpenSSL SSL_CTX inside the HTTP listener's
// boost::asio::ssl::context (server/http_server.cc).
// With a client CA, both listeners require and verify a client certificate
// signed by it (mutual TLS). TLS 1.2 is the lowest version offered.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace kvserve::server {

struct TlsOptions {
  std::string cert_file;       // PEM certificate chain, leaf first
  std::string key_file;        // PEM private key of the leaf
  std::string client_ca_file;  // PEM CA bundle; non-empty: mutual TLS

  bool enabled() const { return !cert_file.empty(); }
};

// OK when TLS is off, or the files are consistent and usable.
// InvalidArgument naming the flag otherwise (--tls-key without --tls-cert,
// an unreadable or unparseable file, a key that does not match).
[[nodiscard]] absl::Status CheckTlsOptions(const TlsOptions& tls);

// Insecure credentials when TLS is off; else SSL credentials from the files
// (checked by CheckTlsOptions first).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
GrpcServerCredentials(const TlsOptions& tls);

// Configures `ctx` for an HTTPS listener; false (with the reason in
// `error`) when a file does not load.
[[nodiscard]] bool SetUpSslContext(const TlsOptions& tls, SSL_CTX& ctx,
                                   std::string* error);

}  // namespace kvserve::server
