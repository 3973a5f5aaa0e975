#include "server/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::server {
namespace {

// The oldest queued OpenSSL error as text (and clears the queue).
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int)
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Parses the first PEM object of `pem` with `read`.
template <typename T, typename Read>
T* ParsePem(const std::string& pem, Read read) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return nullptr;
  T* out = read(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return out;
}

absl::Status CheckKeyPair(const TlsOptions& tls) {
  KV_ASSIGN_OR_RETURN(const std::string cert_pem,
                      ReadFile("--tls-cert", tls.cert_file));
  KV_ASSIGN_OR_RETURN(const std::string key_pem,
                      ReadFile("--tls-key", tls.key_file));
  X509* cert = ParsePem<X509>(cert_pem, PEM_read_bio_X509);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert: '", tls.cert_file,
                     "' holds no PEM certificate (", OpenSslError(), ")"));
  }
  EVP_PKEY* key = ParsePem<EVP_PKEY>(key_pem, PEM_read_bio_PrivateKey);
  if (key == nullptr) {
    X509_free(cert);
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: '", tls.key_file,
        "' holds no unencrypted PEM private key (", OpenSslError(), ")"));
  }
  const bool match = X509_check_private_key(cert, key) == 1;
  ERR_clear_error();
  EVP_PKEY_free(key);
  X509_free(cert);
  if (!match) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: '", tls.key_file,
                     "' is not the key of --tls-cert '", tls.cert_file, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTlsOptions(const TlsOptions& tls) {
  if (!tls.enabled()) {
    if (!tls.key_file.empty()) {
      return absl::InvalidArgumentError("--tls-key: needs --tls-cert");
    }
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is "
          "TLS)");
    }
    return absl::OkStatus();
  }
  if (tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert: needs --tls-key");
  }
  KV_RETURN_IF_ERROR(CheckKeyPair(tls));
  if (tls.client_ca_file.empty()) return absl::OkStatus();
  KV_ASSIGN_OR_RETURN(const std::string ca_pem,
                      ReadFile("--tls-client-ca", tls.client_ca_file));
  X509* ca = ParsePem<X509>(ca_pem, PEM_read_bio_X509);
  if (ca == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-client-ca: '", tls.client_ca_file,
                     "' holds no PEM certificate (", OpenSslError(), ")"));
  }
  X509_free(ca);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  KV_RETURN_IF_ERROR(CheckTlsOptions(tls));
  grpc::SslServerCredentialsOptions opts(
      tls.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  KV_ASSIGN_OR_RETURN(pair.private_key, ReadFile("--tls-key", tls.key_file));
  KV_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile("--tls-cert", tls.cert_file));
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    KV_ASSIGN_OR_RETURN(opts.pem_root_certs,
                        ReadFile("--tls-client-ca", tls.client_ca_file));
  }
  return grpc::SslServerCredentials(opts);
}

bool SetUpSslContext(const TlsOptions& tls, SSL_CTX& ctx, std::string* error) {
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION |
                                SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(&ctx, tls.cert_file.c_str()) != 1) {
    *error = absl::StrCat("--tls-cert: ", OpenSslError());
    return false;
  }
  if (SSL_CTX_use_PrivateKey_file(&ctx, tls.key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(&ctx) != 1) {
    *error = absl::StrCat("--tls-key: ", OpenSslError());
    return false;
  }
  if (tls.client_ca_file.empty()) return true;
  if (SSL_CTX_load_verify_locations(&ctx, tls.client_ca_file.c_str(),
                                    nullptr) != 1) {
    *error = absl::StrCat("--tls-client-ca: ", OpenSslError());
    return false;
  }
  // The CA names sent in the CertificateRequest; ownership passes to ctx.
  SSL_CTX_set_client_CA_list(
      &ctx, SSL_load_client_CA_file(tls.client_ca_file.c_str()));
  SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     nullptr);
  return true;
}

}  // namespace kvserve::server
