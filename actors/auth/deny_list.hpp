// The run's deny list: tokens revoked and peers banned by the authority, signed by it and kept in
// the DHT (later issues add BTARD's bans). A node keeps the verified list of the highest serial.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/auth/identity.hpp"
#include "actors/auth/refusal.hpp"
#include "actors/auth/signed.hpp"

namespace starling::actors::auth {

/// Most entries a deny list may hold.
inline constexpr size_t max_deny_entries = 65536;
/// Longest reason of an entry, in bytes.
inline constexpr size_t max_deny_reason_bytes = 256;
/// Largest signed deny list accepted, in bytes.
inline constexpr size_t max_deny_list_bytes = 64u << 20;

/// One entry of a deny list.
struct deny_entry {
  /// What `id` names.
  enum class kind_t : uint8_t {
    /// A token (id: its 16-byte token id): revoked.
    token = 0,
    /// A peer (id: its 32-byte public key): banned, whatever token it shows.
    peer = 1,
  };
  /// What `id` names.
  kind_t kind = kind_t::token;
  /// The token id or the public key.
  std::string id;
  /// Why, in one line (told to the refused peer).
  std::string reason;
  /// When the entry was added (Unix ns).
  int64_t added_at_ns = 0;
  /// Until when it holds (Unix ns); 0 for ever.
  int64_t until_ns = 0;

  /// True while the entry holds at `now_ns`.
  bool active(int64_t now_ns) const noexcept { return until_ns == 0 || now_ns < until_ns; }
};

/// A deny list of one run.
struct deny_list {
  /// The run it belongs to.
  std::string experiment;
  /// Increases with every list the authority signs.
  uint64_t serial = 0;
  /// When it was signed (Unix ns).
  int64_t issued_at_ns = 0;
  /// The entries.
  std::vector<deny_entry> entries;
  /// The signer's public key (set by `encode_deny_list`).
  std::string authority_key;

  /// The active entry revoking token `token_id` at `now_ns`, or null.
  const deny_entry* revoked(std::string_view token_id, int64_t now_ns) const;
  /// The active entry banning the peer with public key `peer_key` at `now_ns`, or null.
  const deny_entry* banned(std::string_view peer_key, int64_t now_ns) const;
};

/// Signs `list` with the authority's key (its `authority_key` is set to that key's) and returns
/// the `Signed` flat array. Fails on entries out of range.
result<std::string> encode_deny_list(const deny_list& list, const key_pair& authority);

/// Parses a signed deny list's structure and every field's range (no signature check).
checked<deny_list> decode_deny_list(std::string_view bytes);

/// Parses and verifies a signed deny list: structure, the authority of `trust`, its signature
/// and its experiment.
checked<deny_list> verify_deny_list(std::string_view bytes, const trust_anchor& trust);

} // namespace starling::actors::auth
