// The sealed direct link of a closed run: a handshake in which both nodes prove their identity
// keys and agree on session keys, then every byte of the link (frames, metas, payloads) in sealed
// records. Pure: libsodium and the identity keys, no CAF and no LibTorch, so the fuzzer links it.
// All integers are little-endian.
//
//   connector -> acceptor: preamble (24 bytes, link_frame.hpp) with version 2: a sealed link
//   connector -> acceptor: hello  (104 bytes) magic "STH1", kind 1, ciphers offered (u8 bits:
//                          1 AES-256-GCM, 2 XChaCha20-Poly1305; 2 always), reserved (u16, 0),
//                          node key (Ed25519, 32), ephemeral key (X25519, 32), nonce (32)
//   acceptor -> connector: reply  (168 bytes) magic, kind 2, the cipher chosen (one bit of the
//                          offer: AES-256-GCM when both sides have it), reserved, node key,
//                          ephemeral key, nonce, then the signature (64) of
//                          "starling-link-acceptor" || T by the acceptor's node key
//   connector -> acceptor: finish (72 bytes)  magic, kind 3, 0, reserved, then the signature of
//                          "starling-link-connector" || T by the connector's node key
// T = BLAKE2b-256("starling-link-v2", experiment (u32 length, bytes), the preamble's token, the
// hello, the reply's first 104 bytes): it binds both nonces, both ephemeral keys, the run and the
// one-time token, so a signature answers this link only. Each side then checks that the other's
// proven node key is admitted by its gate (runtime/node/gate.hpp).
//
// Session keys: crypto_kx over the ephemeral keys (one key per direction), each then hashed with
// T (keyed BLAKE2b-256). A record:
//   header (8 bytes): magic "STR1", plaintext length (u32, 1 .. 1 MiB), then the ciphertext and
//   its 16-byte tag; additional data = the header; nonce = the record's number in its direction
//   (u64, from 0; never sent). A tampered, replayed, reordered or dropped record fails its tag.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/transfer/link_frame.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {
class key_pair;
}

namespace starling::actors::transfer {

inline constexpr size_t link_hello_bytes = 104;
inline constexpr size_t link_reply_bytes = 168;
inline constexpr size_t link_finish_bytes = 72;
inline constexpr size_t sealed_header_bytes = 8;
inline constexpr size_t sealed_tag_bytes = 16;
/// Largest plaintext of one record: large tensors are sealed in pieces of this size, so a link
/// holds at most one record in memory per direction.
inline constexpr uint32_t sealed_max_record = uint32_t{1} << 20;

/// Cipher bits of the handshake.
inline constexpr uint8_t cipher_aes256gcm = 1;
inline constexpr uint8_t cipher_xchacha20 = 2;

/// The ciphers this machine offers (XChaCha20-Poly1305 always, AES-256-GCM with AES-NI).
uint8_t local_ciphers();

/// "AES-256-GCM" or "XChaCha20-Poly1305".
const char* cipher_name(uint8_t cipher);

/// Writes the preamble of a sealed link (version 2).
void write_sealed_preamble(const link_token& token, uint8_t* out);
/// Parses an untrusted preamble that must announce a sealed link (version 2).
result<link_token> parse_sealed_preamble(const uint8_t* bytes, size_t size);

/// A handshake message, as decoded (structure checked, signature not yet).
struct link_hello {
  /// 1 hello, 2 reply, 3 finish.
  uint8_t kind = 0;
  /// Offered (hello) or chosen (reply) ciphers; 0 in a finish.
  uint8_t ciphers = 0;
  /// Node key, ephemeral key and nonce (32 bytes each; empty in a finish).
  std::string node_key;
  std::string ephemeral;
  std::string nonce;
  /// 64 bytes in a reply and a finish.
  std::string signature;
};

/// Parses an untrusted handshake message of kind `kind` (its size must be that kind's); fails
/// on a wrong size, magic or kind, reserved bits, or ciphers out of range.
result<link_hello> parse_link_hello(const uint8_t* bytes, size_t size, uint8_t kind);

/// Parses an untrusted record header: the plaintext length (1 .. sealed_max_record).
result<uint32_t> parse_sealed_header(const uint8_t* bytes, size_t size);
/// Writes a record header for `length` plaintext bytes.
void write_sealed_header(uint32_t length, uint8_t* out);

/// One direction's cipher state: a key and the next record's number. Not thread-safe (one
/// writer or one reader thread owns it).
class record_cipher {
public:
  record_cipher(uint8_t cipher, const std::array<uint8_t, 32>& key);
  ~record_cipher();
  record_cipher(const record_cipher&) = delete;
  record_cipher& operator=(const record_cipher&) = delete;

  /// Seals `n` (1 .. sealed_max_record) bytes of `plain` into `out` (header, ciphertext, tag:
  /// n + 24 bytes); `plain` may be `out + sealed_header_bytes` (in place).
  void seal(const uint8_t* plain, size_t n, uint8_t* out);
  /// Opens a record in place: `header` as read, `data` its `n` ciphertext bytes, `tag` the 16
  /// bytes after them. Fails (and the link must close) when the tag does not match.
  status open(const uint8_t* header, uint8_t* data, size_t n, const uint8_t* tag);

  /// Records sealed or opened so far.
  uint64_t records() const { return counter_; }
  /// The cipher in use.
  uint8_t cipher() const { return cipher_; }

private:
  void nonce(uint8_t* out) const;

  uint8_t cipher_;
  std::array<uint8_t, 32> key_;
  struct aes_state;
  std::unique_ptr<aes_state> aes_;
  uint64_t counter_ = 0;
};

/// What a finished handshake gives the link.
struct link_session {
  /// The other side's node key (proven: it signed this link's transcript).
  std::string peer_key;
  /// The cipher both sides use.
  uint8_t cipher = 0;
  /// Keys of the records this side sends and receives.
  std::array<uint8_t, 32> tx{};
  std::array<uint8_t, 32> rx{};
};

/// One side of the handshake (see the top of this file). Each step either returns the bytes to
/// send or refuses what came, with a line that names the reason.
class link_handshake {
public:
  /// `me` signs; `experiment` and `token` (the preamble's) enter the transcript. `ciphers` is
  /// what this side offers (local_ciphers() unless a test says otherwise).
  link_handshake(const auth::key_pair& me, std::string experiment, const link_token& token,
                 uint8_t ciphers = local_ciphers());
  ~link_handshake();

  // connector
  /// The hello to send first.
  std::array<uint8_t, link_hello_bytes> hello();
  /// Checks the acceptor's reply (structure, cipher, signature) and derives the keys.
  status on_reply(const uint8_t* bytes, size_t size);
  /// The finish to send after an accepted reply.
  std::array<uint8_t, link_finish_bytes> finish();

  // acceptor
  /// Reads the connector's hello (structure only; the key is proven by its finish).
  status on_hello(const uint8_t* bytes, size_t size);
  /// The reply to send after an accepted hello; derives the keys.
  result<std::array<uint8_t, link_reply_bytes>> reply();
  /// Checks the connector's finish (its signature of the transcript).
  status on_finish(const uint8_t* bytes, size_t size);

  /// The session after the last step succeeded.
  const link_session& session() const { return session_; }
  /// True when the last step failed on a signature (a forged message or the wrong key), not on
  /// the message's structure.
  bool forged() const { return forged_; }

private:
  status derive(bool connector);
  std::string transcript_hash() const;

  const auth::key_pair& me_;
  std::string experiment_;
  link_token token_;
  uint8_t ciphers_;
  std::array<uint8_t, 32> eph_pk_{};
  std::array<uint8_t, 32> eph_sk_{};
  std::array<uint8_t, 32> nonce_{};
  std::array<uint8_t, link_hello_bytes> hello_{};
  std::array<uint8_t, link_hello_bytes> reply_head_{};
  std::string peer_eph_;
  link_session session_;
  bool forged_ = false;
};

} // namespace starling::actors::transfer
