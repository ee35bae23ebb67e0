// File: tessera/apisim/tls.h
//
// A self-signed serving certificate for the simulator, made with the OpenSSL API: an EC P-256
// key and an X.509 v3 certificate valid for one year with subjectAltName DNS:localhost and
// IP:127.0.0.1. The certificate is its own CA (basicConstraints CA:TRUE), so a kubeconfig can
// carry it as certificate-authority-data. Thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tessera::apisim {

struct PemPair {
  std::string cert_pem;
  std::string key_pem;
};

absl::StatusOr<PemPair> GenerateSelfSignedCert();

}  // namespace tessera::apisim
