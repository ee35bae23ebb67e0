#include "tessera/apisim/tls.h"

#include <memory>

#include "absl/status/status.h"
#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace tessera::apisim {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};

std::string BioString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

bool AddExt(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  return ext != nullptr && X509_add_ext(cert, ext.get(), -1) == 1;
}

}  // namespace

absl::StatusOr<PemPair> GenerateSelfSignedCert() {
  std::unique_ptr<EVP_PKEY_CTX, Free> kctx(EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nullptr));
  EVP_PKEY* raw_key = nullptr;
  if (kctx == nullptr || EVP_PKEY_keygen_init(kctx.get()) != 1 ||
      EVP_PKEY_CTX_set_ec_paramgen_curve_nid(kctx.get(), NID_X9_62_prime256v1) != 1 ||
      EVP_PKEY_keygen(kctx.get(), &raw_key) != 1) {
    return absl::InternalError("OpenSSL: cannot generate an EC P-256 key");
  }
  std::unique_ptr<EVP_PKEY, Free> key(raw_key);
  std::unique_ptr<X509, Free> cert(X509_new());
  if (cert == nullptr) {
    return absl::InternalError("OpenSSL: X509_new failed");
  }
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("tessera-apisim"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  if (!AddExt(cert.get(), NID_basic_constraints, "critical,CA:TRUE") ||
      !AddExt(cert.get(), NID_key_usage, "critical,digitalSignature,keyCertSign") ||
      !AddExt(cert.get(), NID_ext_key_usage, "serverAuth") ||
      !AddExt(cert.get(), NID_subject_key_identifier, "hash") ||
      !AddExt(cert.get(), NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1")) {
    return absl::InternalError("OpenSSL: cannot add certificate extensions");
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("OpenSSL: cannot sign the certificate");
  }
  std::unique_ptr<BIO, Free> cbio(BIO_new(BIO_s_mem()));
  std::unique_ptr<BIO, Free> kbio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(cbio.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(kbio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return absl::InternalError("OpenSSL: cannot encode PEM");
  }
  return PemPair{BioString(cbio.get()), BioString(kbio.get())};
}

}  // namespace tessera::apisim
