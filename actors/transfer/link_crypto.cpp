#include "actors/transfer/link_crypto.hpp"

#include <cstring>

#include <sodium.h>

#include "actors/auth/identity.hpp"

namespace starling::actors::transfer {

namespace {

constexpr uint32_t hello_magic = 0x31485453;  // "STH1"
constexpr uint32_t record_magic = 0x31525453; // "STR1"
constexpr size_t head_bytes = 8;
constexpr size_t key_bytes = 32;

constexpr const char* acceptor_context = "starling-link-acceptor";
constexpr const char* connector_context = "starling-link-connector";

size_t size_of_kind(uint8_t kind) {
  switch (kind) {
    case 1:
      return link_hello_bytes;
    case 2:
      return link_reply_bytes;
    case 3:
      return link_finish_bytes;
    default:
      return 0;
  }
}

void write_head(uint8_t kind, uint8_t ciphers, uint8_t* out) {
  write_le(out, hello_magic, 4);
  out[4] = kind;
  out[5] = ciphers;
  write_le(out + 6, 0, 2);
}

} // namespace

uint8_t local_ciphers() {
  if (sodium_init() < 0)
    return cipher_xchacha20;
  return static_cast<uint8_t>(cipher_xchacha20
                              | (crypto_aead_aes256gcm_is_available() ? cipher_aes256gcm : 0));
}

const char* cipher_name(uint8_t cipher) {
  return cipher == cipher_aes256gcm ? "AES-256-GCM" : "XChaCha20-Poly1305";
}

void write_sealed_preamble(const link_token& token, uint8_t* out) {
  write_link_preamble(token, out, link_sealed_version);
}

result<link_token> parse_sealed_preamble(const uint8_t* bytes, size_t size) {
  return parse_link_preamble(bytes, size, link_sealed_version);
}

result<link_hello> parse_link_hello(const uint8_t* bytes, size_t size, uint8_t kind) {
  static const char* names[] = {"", "hello", "reply", "finish"};
  auto expected = size_of_kind(kind);
  if (expected == 0)
    return fail("sealed link: no handshake message of kind " + std::to_string(kind));
  std::string name = names[kind];
  if (size != expected)
    return fail("sealed link: a " + name + " of " + std::to_string(size) + " bytes, expected "
                + std::to_string(expected));
  if (read_le(bytes, 4) != hello_magic)
    return fail("sealed link: bad handshake magic in the " + name);
  if (bytes[4] != kind)
    return fail("sealed link: handshake message of kind " + std::to_string(bytes[4])
                + " where a " + name + " (kind " + std::to_string(kind) + ") was expected");
  if (read_le(bytes + 6, 2) != 0)
    return fail("sealed link: reserved bits set in the " + name);
  link_hello h;
  h.kind = kind;
  h.ciphers = bytes[5];
  switch (kind) {
    case 1:
      if ((h.ciphers & ~(cipher_aes256gcm | cipher_xchacha20)) != 0
          || (h.ciphers & cipher_xchacha20) == 0)
        return fail("sealed link: a hello offering ciphers " + std::to_string(h.ciphers)
                    + " (XChaCha20-Poly1305 must be among them)");
      break;
    case 2:
      if (h.ciphers != cipher_aes256gcm && h.ciphers != cipher_xchacha20)
        return fail("sealed link: a reply choosing cipher " + std::to_string(h.ciphers)
                    + " (1 or 2 expected)");
      break;
    default:
      if (h.ciphers != 0)
        return fail("sealed link: a finish with ciphers " + std::to_string(h.ciphers));
  }
  const auto* p = reinterpret_cast<const char*>(bytes) + head_bytes;
  if (kind != 3) {
    h.node_key.assign(p, key_bytes);
    h.ephemeral.assign(p + key_bytes, key_bytes);
    h.nonce.assign(p + 2 * key_bytes, key_bytes);
    p += 3 * key_bytes;
  }
  if (kind != 1)
    h.signature.assign(p, auth::signature_bytes);
  return h;
}

result<uint32_t> parse_sealed_header(const uint8_t* bytes, size_t size) {
  if (size != sealed_header_bytes)
    return fail("sealed link: a record header of " + std::to_string(size)
                + " bytes, expected 8");
  if (read_le(bytes, 4) != record_magic)
    return fail("sealed link: bad record magic (not a sealed record)");
  auto n = read_le(bytes + 4, 4);
  if (n == 0 || n > sealed_max_record)
    return fail("sealed link: a record declares " + std::to_string(n)
                + " bytes (1 .. 1048576)");
  return static_cast<uint32_t>(n);
}

void write_sealed_header(uint32_t length, uint8_t* out) {
  write_le(out, record_magic, 4);
  write_le(out + 4, length, 4);
}

// -- records -----------------------------------------------------------------------------------

struct record_cipher::aes_state {
  crypto_aead_aes256gcm_state st;
};

record_cipher::record_cipher(uint8_t cipher, const std::array<uint8_t, 32>& key)
  : cipher_(cipher), key_(key) {
  if (cipher_ == cipher_aes256gcm) {
    aes_ = std::make_unique<aes_state>();
    crypto_aead_aes256gcm_beforenm(&aes_->st, key_.data());
  }
}

record_cipher::~record_cipher() {
  sodium_memzero(key_.data(), key_.size());
  if (aes_)
    sodium_memzero(&aes_->st, sizeof aes_->st);
}

void record_cipher::nonce(uint8_t* out) const {
  std::memset(out, 0, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
  write_le(out, counter_, 8);
}

void record_cipher::seal(const uint8_t* plain, size_t n, uint8_t* out) {
  write_sealed_header(static_cast<uint32_t>(n), out);
  uint8_t npub[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
  nonce(npub);
  auto* c = out + sealed_header_bytes;
  if (aes_)
    crypto_aead_aes256gcm_encrypt_detached_afternm(c, c + n, nullptr, plain, n, out,
                                                   sealed_header_bytes, nullptr, npub, &aes_->st);
  else
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c, c + n, nullptr, plain, n, out,
                                                        sealed_header_bytes, nullptr, npub,
                                                        key_.data());
  ++counter_;
}

status record_cipher::open(const uint8_t* header, uint8_t* data, size_t n, const uint8_t* tag) {
  uint8_t npub[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
  nonce(npub);
  int r = aes_ ? crypto_aead_aes256gcm_decrypt_detached_afternm(
                   data, nullptr, data, n, tag, header, sealed_header_bytes, npub, &aes_->st)
               : crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                   data, nullptr, data, n, tag, header, sealed_header_bytes, npub, key_.data());
  if (r != 0)
    return fail("sealed record " + std::to_string(counter_)
                + " failed authentication (tampered, replayed, reordered or dropped)");
  ++counter_;
  return {};
}

// -- handshake ---------------------------------------------------------------------------------

link_handshake::link_handshake(const auth::key_pair& me, std::string experiment,
                               const link_token& token, uint8_t ciphers)
  : me_(me), experiment_(std::move(experiment)), token_(token),
    ciphers_(static_cast<uint8_t>(ciphers | cipher_xchacha20)) {
  crypto_kx_keypair(eph_pk_.data(), eph_sk_.data());
  randombytes_buf(nonce_.data(), nonce_.size());
}

link_handshake::~link_handshake() {
  sodium_memzero(eph_sk_.data(), eph_sk_.size());
}

std::array<uint8_t, link_hello_bytes> link_handshake::hello() {
  write_head(1, ciphers_, hello_.data());
  std::memcpy(hello_.data() + head_bytes, me_.public_key().data(), key_bytes);
  std::memcpy(hello_.data() + head_bytes + key_bytes, eph_pk_.data(), key_bytes);
  std::memcpy(hello_.data() + head_bytes + 2 * key_bytes, nonce_.data(), key_bytes);
  return hello_;
}

std::string link_handshake::transcript_hash() const {
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  static const char label[] = "starling-link-v2";
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(label), sizeof label - 1);
  uint8_t len[4];
  write_le(len, experiment_.size(), 4);
  crypto_generichash_update(&st, len, sizeof len);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(experiment_.data()),
                            experiment_.size());
  crypto_generichash_update(&st, token_.data(), token_.size());
  crypto_generichash_update(&st, hello_.data(), hello_.size());
  crypto_generichash_update(&st, reply_head_.data(), reply_head_.size());
  std::string out(32, '\0');
  crypto_generichash_final(&st, reinterpret_cast<uint8_t*>(out.data()), out.size());
  return out;
}

status link_handshake::derive(bool connector) {
  std::array<uint8_t, 32> rx{};
  std::array<uint8_t, 32> tx{};
  const auto* peer = reinterpret_cast<const uint8_t*>(peer_eph_.data());
  int r = connector
            ? crypto_kx_client_session_keys(rx.data(), tx.data(), eph_pk_.data(),
                                            eph_sk_.data(), peer)
            : crypto_kx_server_session_keys(rx.data(), tx.data(), eph_pk_.data(),
                                            eph_sk_.data(), peer);
  if (r != 0)
    return fail("sealed link: the peer's ephemeral key is not a usable X25519 key");
  auto t = transcript_hash();
  const auto* th = reinterpret_cast<const uint8_t*>(t.data());
  crypto_generichash(session_.tx.data(), 32, th, t.size(), tx.data(), tx.size());
  crypto_generichash(session_.rx.data(), 32, th, t.size(), rx.data(), rx.size());
  sodium_memzero(rx.data(), rx.size());
  sodium_memzero(tx.data(), tx.size());
  return {};
}

status link_handshake::on_reply(const uint8_t* bytes, size_t size) {
  auto h = parse_link_hello(bytes, size, 2);
  if (!h)
    return h.error();
  if ((h->ciphers & ciphers_) == 0)
    return fail(std::string{"sealed link: the acceptor chose "} + cipher_name(h->ciphers)
                + ", which this side did not offer");
  std::memcpy(reply_head_.data(), bytes, reply_head_.size());
  session_.peer_key = h->node_key;
  session_.cipher = h->ciphers;
  peer_eph_ = h->ephemeral;
  auto t = transcript_hash();
  if (!auth::verify_signature(h->node_key, acceptor_context + t, h->signature)) {
    forged_ = true;
    return fail("sealed link: the acceptor's signature does not verify (not the holder of "
                "the node key it names, or a forged reply)");
  }
  return derive(true);
}

std::array<uint8_t, link_finish_bytes> link_handshake::finish() {
  std::array<uint8_t, link_finish_bytes> out{};
  write_head(3, 0, out.data());
  auto sig = me_.sign(connector_context + transcript_hash());
  std::memcpy(out.data() + head_bytes, sig.data(), sig.size());
  return out;
}

status link_handshake::on_hello(const uint8_t* bytes, size_t size) {
  auto h = parse_link_hello(bytes, size, 1);
  if (!h)
    return h.error();
  std::memcpy(hello_.data(), bytes, hello_.size());
  session_.peer_key = h->node_key;
  // AES-256-GCM when both have it (AES-NI); XChaCha20-Poly1305 otherwise.
  session_.cipher = (h->ciphers & ciphers_ & cipher_aes256gcm) != 0 ? cipher_aes256gcm
                                                                     : cipher_xchacha20;
  peer_eph_ = h->ephemeral;
  return {};
}

result<std::array<uint8_t, link_reply_bytes>> link_handshake::reply() {
  std::array<uint8_t, link_reply_bytes> out{};
  write_head(2, session_.cipher, out.data());
  std::memcpy(out.data() + head_bytes, me_.public_key().data(), key_bytes);
  std::memcpy(out.data() + head_bytes + key_bytes, eph_pk_.data(), key_bytes);
  std::memcpy(out.data() + head_bytes + 2 * key_bytes, nonce_.data(), key_bytes);
  std::memcpy(reply_head_.data(), out.data(), reply_head_.size());
  if (auto st = derive(false); !st)
    return st.what().empty() ? fail("sealed link: key derivation failed") : fail(st.what());
  auto sig = me_.sign(acceptor_context + transcript_hash());
  std::memcpy(out.data() + link_hello_bytes, sig.data(), sig.size());
  return out;
}

status link_handshake::on_finish(const uint8_t* bytes, size_t size) {
  auto h = parse_link_hello(bytes, size, 3);
  if (!h)
    return h.error();
  if (!auth::verify_signature(session_.peer_key, connector_context + transcript_hash(),
                              h->signature)) {
    forged_ = true;
    return fail("sealed link: the connector's signature does not verify (not the holder of "
                "the node key it named, or a forged finish)");
  }
  return {};
}

} // namespace starling::actors::transfer
