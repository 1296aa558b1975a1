#include "actors/auth/certificates.hpp"

#include <ctime>
#include <memory>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace starling::actors::auth {

namespace {

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;
using name_ptr = std::unique_ptr<X509_NAME, deleter<X509_NAME, X509_NAME_free>>;
using bio_ptr = std::unique_ptr<BIO, deleter<BIO, BIO_free_all>>;
using store_ptr = std::unique_ptr<X509_STORE, deleter<X509_STORE, X509_STORE_free>>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using bn_ptr = std::unique_ptr<BIGNUM, deleter<BIGNUM, BN_free>>;

/// OpenSSL's queued errors as one line (and the queue emptied).
std::string ssl_errors() {
  std::string out;
  while (auto e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out += (out.empty() ? "" : "; ") + std::string{buf};
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

failure ssl_fail(const std::string& what) {
  return fail(what + ": " + ssl_errors());
}

pkey_ptr secret_pkey(const key_pair& key) {
  auto seed = key.seed();
  return pkey_ptr{EVP_PKEY_new_raw_private_key(
    EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(seed.data()), seed.size())};
}

pkey_ptr public_pkey(std::string_view pk) {
  return pkey_ptr{EVP_PKEY_new_raw_public_key(
    EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(pk.data()), pk.size())};
}

name_ptr make_name(const std::string& cn) {
  name_ptr n{X509_NAME_new()};
  if (!n)
    return n;
  auto add = [&](const char* field, const std::string& v) {
    return X509_NAME_add_entry_by_txt(n.get(), field, MBSTRING_UTF8,
                                      reinterpret_cast<const unsigned char*>(v.data()),
                                      static_cast<int>(v.size()), -1, 0)
           == 1;
  };
  if (!add("O", "starling") || !add("CN", cn))
    return name_ptr{};
  return n;
}

std::string ca_common_name(std::string_view experiment) {
  // CN is limited to 64 characters.
  return ("starling authority " + std::string{experiment}).substr(0, 64);
}

bool add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  auto* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext)
    return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

/// A certificate with everything but extensions and signature.
result<x509_ptr> make_cert(EVP_PKEY* subject_key, const std::string& subject_cn,
                           const std::string& issuer_cn, std::string_view serial,
                           int64_t not_before_ns, int64_t not_after_ns) {
  if (not_after_ns <= not_before_ns)
    return fail("a certificate's validity ends after it starts");
  x509_ptr cert{X509_new()};
  if (!cert)
    return ssl_fail("X509_new");
  auto subject = make_name(subject_cn);
  auto issuer = make_name(issuer_cn);
  if (!subject || !issuer)
    return ssl_fail("certificate names");
  bn_ptr sn{BN_bin2bn(reinterpret_cast<const unsigned char*>(serial.data()),
                      static_cast<int>(serial.size()), nullptr)};
  if (!sn)
    return ssl_fail("certificate serial");
  // A serial number is positive: clear the sign bit's worth by masking the top byte.
  BN_clear_bit(sn.get(), static_cast<int>(serial.size() * 8 - 1));
  if (BN_is_zero(sn.get()))
    BN_set_word(sn.get(), 1);
  if (X509_set_version(cert.get(), 2) != 1 || !BN_to_ASN1_INTEGER(sn.get(), X509_get_serialNumber(cert.get()))
      || X509_set_subject_name(cert.get(), subject.get()) != 1
      || X509_set_issuer_name(cert.get(), issuer.get()) != 1
      || X509_set_pubkey(cert.get(), subject_key) != 1
      || !ASN1_TIME_set(X509_getm_notBefore(cert.get()),
                        static_cast<time_t>(not_before_ns / 1'000'000'000))
      || !ASN1_TIME_set(X509_getm_notAfter(cert.get()),
                        static_cast<time_t>(not_after_ns / 1'000'000'000)))
    return ssl_fail("certificate fields");
  return cert;
}

result<std::string> to_pem(X509* cert) {
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1)
    return ssl_fail("PEM_write_bio_X509");
  char* data = nullptr;
  auto n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

result<x509_ptr> read_pem(std::string_view pem, const char* what) {
  bio_ptr bio{BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))};
  if (!bio)
    return ssl_fail(what);
  x509_ptr cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)};
  if (!cert)
    return ssl_fail(std::string{what} + ": not a PEM certificate");
  return cert;
}

result<std::string> ed25519_key_of(X509* cert) {
  auto* pk = X509_get0_pubkey(cert);
  unsigned char raw[public_key_bytes];
  size_t len = sizeof(raw);
  if (!pk || EVP_PKEY_get_base_id(pk) != EVP_PKEY_ED25519
      || EVP_PKEY_get_raw_public_key(pk, raw, &len) != 1 || len != sizeof(raw))
    return fail("the certificate's key is not Ed25519");
  return std::string(reinterpret_cast<char*>(raw), len);
}

} // namespace

result<std::string> make_ca_certificate(const key_pair& authority, std::string_view experiment,
                                        int64_t not_before_ns, int64_t not_after_ns) {
  ERR_clear_error();
  auto key = secret_pkey(authority);
  if (!key)
    return ssl_fail("the authority key");
  auto cn = ca_common_name(experiment);
  // The CA's serial: the first bytes of its public key (one CA per authority key).
  auto cert = make_cert(key.get(), cn, cn, authority.public_key().substr(0, 16), not_before_ns,
                        not_after_ns);
  if (!cert)
    return cert.error();
  auto* c = cert->get();
  if (!add_ext(c, c, NID_basic_constraints, "critical,CA:TRUE,pathlen:0")
      || !add_ext(c, c, NID_key_usage, "critical,keyCertSign,cRLSign")
      || !add_ext(c, c, NID_subject_key_identifier, "hash"))
    return ssl_fail("CA certificate extensions");
  // Ed25519 signs without a separate digest.
  if (X509_sign(c, key.get(), nullptr) <= 0)
    return ssl_fail("signing the CA certificate");
  return to_pem(c);
}

result<std::string> make_node_certificate(const key_pair& authority, std::string_view experiment,
                                          std::string_view node_public_key,
                                          std::string_view serial, int64_t not_before_ns,
                                          int64_t not_after_ns) {
  ERR_clear_error();
  if (node_public_key.size() != public_key_bytes)
    return fail("a node public key is 32 bytes, got " + std::to_string(node_public_key.size()));
  if (serial.empty() || serial.size() > 20)
    return fail("a certificate serial has 1..20 bytes");
  auto ca_key = secret_pkey(authority);
  auto node_key = public_pkey(node_public_key);
  if (!ca_key || !node_key)
    return ssl_fail("certificate keys");
  auto cert = make_cert(node_key.get(), to_hex(peer_id_of(node_public_key)),
                        ca_common_name(experiment), serial, not_before_ns, not_after_ns);
  if (!cert)
    return cert.error();
  auto* c = cert->get();
  if (!add_ext(c, nullptr, NID_basic_constraints, "critical,CA:FALSE")
      || !add_ext(c, nullptr, NID_key_usage, "critical,digitalSignature")
      || !add_ext(c, nullptr, NID_ext_key_usage, "serverAuth,clientAuth"))
    return ssl_fail("node certificate extensions");
  if (X509_sign(c, ca_key.get(), nullptr) <= 0)
    return ssl_fail("signing the node certificate");
  return to_pem(c);
}

result<std::string> private_key_pem(const key_pair& key) {
  ERR_clear_error();
  auto pkey = secret_pkey(key);
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!pkey || !bio
      || PEM_write_bio_PrivateKey(bio.get(), pkey.get(), nullptr, nullptr, 0, nullptr, nullptr)
           != 1)
    return ssl_fail("writing the private key");
  char* data = nullptr;
  auto n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

result<std::string> verify_certificate(std::string_view ca_pem, std::string_view cert_pem,
                                       int64_t now_ns) {
  ERR_clear_error();
  auto ca = read_pem(ca_pem, "CA certificate");
  if (!ca)
    return ca.error();
  auto cert = read_pem(cert_pem, "certificate");
  if (!cert)
    return cert.error();
  store_ptr store{X509_STORE_new()};
  store_ctx_ptr ctx{X509_STORE_CTX_new()};
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca->get()) != 1
      || X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), nullptr) != 1)
    return ssl_fail("certificate store");
  X509_STORE_CTX_set_time(ctx.get(), 0, static_cast<time_t>(now_ns / 1'000'000'000));
  if (X509_verify_cert(ctx.get()) != 1) {
    auto code = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return fail(std::string{"certificate does not verify: "}
                + X509_verify_cert_error_string(code));
  }
  return ed25519_key_of(cert->get());
}

result<std::string> certified_key(std::string_view cert_pem) {
  ERR_clear_error();
  auto cert = read_pem(cert_pem, "certificate");
  if (!cert)
    return cert.error();
  return ed25519_key_of(cert->get());
}

std::vector<std::string> pem_certificates(std::string_view text) {
  static constexpr std::string_view begin = "-----BEGIN CERTIFICATE-----";
  static constexpr std::string_view end = "-----END CERTIFICATE-----";
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find(begin, pos)) != std::string_view::npos) {
    auto stop = text.find(end, pos);
    if (stop == std::string_view::npos)
      break;
    out.emplace_back(text.substr(pos, stop + end.size() - pos));
    out.back() += '\n';
    pos = stop + end.size();
  }
  return out;
}

} // namespace starling::actors::auth
