// Certificates for caf_openssl: they verify against the run's CA, and an in-memory TLS 1.2
// handshake with caf_openssl's own settings admits members and refuses outsiders on both sides.
#include <doctest/doctest.h>

#include <memory>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "actors/auth/certificates.hpp"

namespace starling::test::actors_certificates_test {

using namespace starling::actors::auth;

namespace {

constexpr int64_t sec = 1'000'000'000;
constexpr int64_t t0 = int64_t{1'800'000'000} * sec;

struct member {
  key_pair key;
  std::string cert;
};

member make_member(const key_pair& authority, uint64_t seed, int64_t from = t0 - 3600 * sec,
                   int64_t until = t0 + 3600 * sec) {
  auto key = key_pair::from_test_seed(seed);
  auto cert = make_node_certificate(authority, "exp", key.public_key(), std::string(16, '\x42'),
                                    from, until);
  REQUIRE_MESSAGE(cert.ok(), cert.error().what);
  return {key, *cert};
}

/// An SSL_CTX configured as caf_openssl configures it when authentication is on.
SSL_CTX* caf_like_context(const member& m, const std::string& ca_pem) {
  // caf_openssl uses TLSv1_2_method(); pinning TLS_method() to 1.2 is the same protocol.
  auto* ctx = SSL_CTX_new(TLS_method());
  REQUIRE(ctx);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
  BIO* cb = BIO_new_mem_buf(m.cert.data(), static_cast<int>(m.cert.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  BIO_free(cb);
  REQUIRE(SSL_CTX_use_certificate(ctx, cert) == 1);
  X509_free(cert);
  auto pem = private_key_pem(m.key);
  REQUIRE(pem.ok());
  BIO* kb = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  REQUIRE(SSL_CTX_use_PrivateKey(ctx, pkey) == 1);
  EVP_PKEY_free(pkey);
  BIO* ab = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509* ca = PEM_read_bio_X509(ab, nullptr, nullptr, nullptr);
  BIO_free(ab);
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
  X509_free(ca);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  REQUIRE(SSL_CTX_set_cipher_list(ctx, "HIGH:!aNULL:!MD5") == 1);
  return ctx;
}

/// Runs a handshake between a client and a server over memory BIOs; true when both finish.
bool handshake(const member& client, const std::string& client_ca, const member& server,
               const std::string& server_ca) {
  auto* cctx = caf_like_context(client, client_ca);
  auto* sctx = caf_like_context(server, server_ca);
  SSL* c = SSL_new(cctx);
  SSL* s = SSL_new(sctx);
  BIO *c_io, *s_io;
  BIO_new_bio_pair(&c_io, 0, &s_io, 0);
  SSL_set_bio(c, c_io, c_io);
  SSL_set_bio(s, s_io, s_io);
  SSL_set_connect_state(c);
  SSL_set_accept_state(s);
  bool c_done = false, s_done = false, failed = false;
  for (int i = 0; i < 50 && !(c_done && s_done) && !failed; ++i) {
    if (!c_done) {
      auto r = SSL_do_handshake(c);
      c_done = r == 1;
      failed |= r <= 0 && SSL_get_error(c, r) != SSL_ERROR_WANT_READ;
    }
    if (!s_done) {
      auto r = SSL_do_handshake(s);
      s_done = r == 1;
      failed |= r <= 0 && SSL_get_error(s, r) != SSL_ERROR_WANT_READ;
    }
  }
  SSL_free(c);
  SSL_free(s);
  SSL_CTX_free(cctx);
  SSL_CTX_free(sctx);
  ERR_clear_error();
  return c_done && s_done && !failed;
}

} // namespace

TEST_CASE("a node certificate verifies against the CA and certifies the node's own key") {
  auto authority = key_pair::from_test_seed(100);
  auto ca = make_ca_certificate(authority, "exp", t0 - 86400 * sec, t0 + 86400 * sec);
  REQUIRE_MESSAGE(ca.ok(), ca.error().what);
  CHECK(*certified_key(*ca) == authority.public_key());
  auto m = make_member(authority, 1);
  auto key = verify_certificate(*ca, m.cert, t0);
  REQUIRE_MESSAGE(key.ok(), key.error().what);
  CHECK(*key == m.key.public_key());
  // Expired, or issued by another authority: refused.
  CHECK_FALSE(verify_certificate(*ca, m.cert, t0 + 7200 * sec).ok());
  auto other = key_pair::from_test_seed(200);
  auto other_ca = make_ca_certificate(other, "exp", t0 - 86400 * sec, t0 + 86400 * sec);
  CHECK_FALSE(verify_certificate(*other_ca, m.cert, t0).ok());
  CHECK_FALSE(verify_certificate(*ca, make_member(other, 2).cert, t0).ok());
  CHECK_FALSE(make_node_certificate(authority, "exp", "short", "s", t0, t0 + 1).ok());
  CHECK(pem_certificates(m.cert + "junk\n" + *ca).size() == 2);
  CHECK(private_key_pem(m.key)->rfind("-----BEGIN PRIVATE KEY-----", 0) == 0);
}

TEST_CASE("TLS 1.2 with caf_openssl's settings admits members and refuses outsiders both ways") {
  auto authority = key_pair::from_test_seed(100);
  // Valid now (OpenSSL checks validity against the real clock here).
  auto now = static_cast<int64_t>(time(nullptr)) * sec;
  auto ca = *make_ca_certificate(authority, "exp", now - 3600 * sec, now + 3600 * sec);
  auto a = make_member(authority, 1, now - 60 * sec, now + 3600 * sec);
  auto b = make_member(authority, 2, now - 60 * sec, now + 3600 * sec);
  CHECK(handshake(a, ca, b, ca));

  auto stranger_authority = key_pair::from_test_seed(300);
  auto stranger_ca = *make_ca_certificate(stranger_authority, "exp", now - 3600 * sec,
                                          now + 3600 * sec);
  auto outsider = make_member(stranger_authority, 3, now - 60 * sec, now + 3600 * sec);
  CHECK_FALSE(handshake(outsider, ca, b, ca));          // the server refuses the outsider
  CHECK_FALSE(handshake(a, ca, outsider, stranger_ca)); // the member refuses the outsider server
  auto expired = make_member(authority, 4, now - 7200 * sec, now - 3600 * sec);
  CHECK_FALSE(handshake(expired, ca, b, ca));
}

} // namespace starling::test::actors_certificates_test
