// 160-bit Kademlia identifiers and the XOR metric (no CAF).
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>

namespace starling::actors::dht {

/// A 160-bit identifier of a peer or a key, big-endian.
struct node_id {
  /// Number of bytes (160 bits).
  static constexpr size_t size = 20;
  std::array<uint8_t, size> bytes{};

  /// The id of a key: BLAKE2b (libsodium `crypto_generichash`) with a 20-byte output.
  static node_id of_key(const std::string& key);
  /// A uniformly random id from a seeded generator.
  static node_id random(std::mt19937_64& rng);
  /// Parses the 20-byte binary form; false when `raw` has another length.
  static bool from_bytes(const std::string& raw, node_id& out);
  /// The 20-byte binary form.
  std::string to_bytes() const;
  /// Lowercase hex (40 characters).
  std::string to_hex() const;
  /// Bit `i` counted from the most significant (0..159).
  bool bit(size_t i) const { return (bytes[i / 8] >> (7 - i % 8)) & 1; }

  friend bool operator==(const node_id& a, const node_id& b) { return a.bytes == b.bytes; }
  friend bool operator!=(const node_id& a, const node_id& b) { return a.bytes != b.bytes; }
  friend bool operator<(const node_id& a, const node_id& b) { return a.bytes < b.bytes; }
};

/// `a XOR b`, the Kademlia distance (compare distances with `<`).
node_id distance(const node_id& a, const node_id& b);

/// True when `a` is strictly closer to `target` than `b`.
bool closer(const node_id& target, const node_id& a, const node_id& b);

/// Length of the common bit prefix of `a` and `b` (160 when equal).
size_t common_prefix(const node_id& a, const node_id& b);

} // namespace starling::actors::dht
