// Ed25519 identities (libsodium, no CAF): a node's key pair, the peer id derived from its public
// key, signatures, and the key files a node keeps between starts (created on first start, mode
// 0600, refused when readable by others or malformed).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/result.hpp"

namespace starling::actors::auth {

/// Bytes of an Ed25519 public key.
inline constexpr size_t public_key_bytes = 32;
/// Bytes of an Ed25519 seed (what a secret key file stores).
inline constexpr size_t seed_bytes = 32;
/// Bytes of an Ed25519 signature.
inline constexpr size_t signature_bytes = 64;
/// Bytes of a peer id: BLAKE2b-160 of the public key, the same 160 bits as the node's DHT id.
inline constexpr size_t peer_id_bytes = 20;

/// An Ed25519 key pair: a node's identity, or the run authority's key.
class key_pair {
public:
  /// The key pair of a 32-byte seed (deterministic).
  static key_pair from_seed(const std::array<uint8_t, seed_bytes>& seed);
  /// A key pair derived from a 64-bit number, for simulations and tests. Equal to
  /// `actors::dht::identity::from_seed` of the same number (seed = BLAKE2b-256 of its 8 bytes).
  static key_pair from_test_seed(uint64_t seed);
  /// A fresh key pair from the OS's randomness.
  static key_pair generate();

  /// The 32-byte public key.
  const std::string& public_key() const noexcept { return public_key_; }
  /// libsodium's 64-byte secret key (seed, then public key); never log it.
  const std::string& secret_key() const noexcept { return secret_key_; }
  /// The 32-byte seed the key pair derives from.
  std::string seed() const { return secret_key_.substr(0, seed_bytes); }
  /// This key's peer id (`peer_id_of(public_key())`).
  std::string peer_id() const;
  /// Detached Ed25519 signature (64 bytes) of `message`.
  std::string sign(std::string_view message) const;

private:
  key_pair(std::string pk, std::string sk) : public_key_(std::move(pk)), secret_key_(std::move(sk)) {}
  std::string public_key_;
  std::string secret_key_;
};

/// True when `signature` is a valid Ed25519 signature of `message` by `public_key` (false for
/// keys or signatures of the wrong size).
bool verify_signature(std::string_view public_key, std::string_view message,
                      std::string_view signature);

/// The peer id of a public key: BLAKE2b with a 20-byte output (= the DHT's `node_id::of_key`).
std::string peer_id_of(std::string_view public_key);

/// Lowercase hex of raw bytes.
std::string to_hex(std::string_view bytes);

/// Raw bytes of lowercase or uppercase hex; fails on odd length or a non-hex character.
result<std::string> from_hex(std::string_view hex);

/// Whose key a key file holds; part of the file's first line, so that one is never taken for the
/// other.
enum class key_role : uint8_t {
  /// A node's identity.
  node = 0,
  /// The run authority's key (signs tokens, deny lists and certificates).
  authority = 1,
};

/// The secret key file's text: a header line naming the role, the seed in hex, the public key in
/// hex (a check against corruption), each ending in '\n'. Always `secret_key_file_bytes(role)`.
std::string format_secret_key(const key_pair& key, key_role role);

/// Exact size of a secret key file of `role`.
size_t secret_key_file_bytes(key_role role);

/// Parses a secret key file's text (untrusted: exact size, header, hex, and the public key must
/// derive from the seed). `what` names the file in errors.
result<key_pair> parse_secret_key(std::string_view text, key_role role, const std::string& what);

/// The public key file's text: a header line naming the role, then the key in hex.
std::string format_public_key(std::string_view public_key, key_role role);

/// Parses a public key file's text (untrusted). A secret key file is refused with a reason that
/// says so (the authority never needs a node's secret).
result<std::string> parse_public_key(std::string_view text, key_role role,
                                     const std::string& what);

/// Reads and parses the secret key file at `path`: it must be a regular file that no one but its
/// owner can read or write (mode 0600 or 0400), else it is refused with the chmod that fixes it.
result<key_pair> load_secret_key_file(const std::string& path, key_role role);

/// Creates the secret key file at `path` (and its folder) holding `key`, mode 0600, atomically:
/// written to a temporary file and linked into place, so a reader never sees half a file. Fails
/// when `path` exists.
status create_secret_key_file(const std::string& path, const key_pair& key, key_role role);

/// What `load_or_create_key` did.
struct loaded_key {
  /// The key pair.
  key_pair key;
  /// True when the file did not exist and was created with a fresh key.
  bool created = false;
};

/// A node's first start creates its key file with a fresh key; later starts load it. A file that
/// exists but is malformed or too open is an error, never replaced.
result<loaded_key> load_or_create_key(const std::string& path, key_role role);

/// Writes the public key file at `path` (mode 0644, replacing an existing one).
status write_public_key_file(const std::string& path, std::string_view public_key, key_role role);

/// Reads and parses the public key file at `path` (at most 4 KiB are read).
result<std::string> load_public_key_file(const std::string& path, key_role role);

/// Reads a whole small file (at most `max_bytes`; larger files are refused, naming both sizes).
result<std::string> read_small_file(const std::string& path, size_t max_bytes);

} // namespace starling::actors::auth
