// Ed25519 identities and signed DHT records (libsodium, no CAF). A key or sub-key that contains
// `owner_marker(public_key)` is owned: only records signed by that key may write it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "messages/dht.hpp"

namespace starling::actors::dht {

/// An Ed25519 key pair.
struct identity {
  /// 32 bytes.
  std::string public_key;
  /// 64 bytes (libsodium's seed + public key form).
  std::string secret_key;

  /// A key pair derived from a 64-bit seed (deterministic, for simulations and tests).
  static identity from_seed(uint64_t seed);
  /// A fresh key pair from the OS's randomness.
  static identity generate();
};

/// `[owner:<hex of public key>]`: put it in a key or sub-key to reserve it for that owner.
std::string owner_marker(const std::string& public_key);

/// The owner's public key if `text` contains an owner marker.
std::optional<std::string> owner_of(const std::string& text);

/// The public key that must have signed `r`: the key's owner if the key is owned, else the
/// sub-key's owner; none when neither is owned.
std::optional<std::string> required_signer(const messages::dht_record& r);

/// Signs `r` with `id` (sets `r.signature`).
void sign(messages::dht_record& r, const identity& id);

/// True when `r` needs no signature or carries a valid one by its required signer.
bool verify(const messages::dht_record& r);

} // namespace starling::actors::dht
