// Signed objects of the run's membership (tokens, deny lists, hellos): the exact body bytes and an
// Ed25519 signature over a domain string and the body (messages/auth.capnp, `Signed`), and what a
// node trusts to check them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "actors/auth/identity.hpp"
#include "actors/auth/refusal.hpp"

namespace starling::actors::auth {

/// Domain of a signed token.
inline constexpr std::string_view token_domain = "starling.token.v1";
/// Domain of a signed deny list.
inline constexpr std::string_view deny_domain = "starling.deny.v1";
/// Domain of a signed hello.
inline constexpr std::string_view hello_domain = "starling.hello.v1";

/// Longest experiment id, in bytes.
inline constexpr size_t max_experiment_bytes = 128;

/// What a node of a run trusts: the authority's key and the run it belongs to.
struct trust_anchor {
  /// The authority's 32-byte public key; empty for an open run (no authority, loopback demos).
  std::string authority_key;
  /// This run's experiment id.
  std::string experiment;
  /// How far a signer's clock (issue times, hello times) may be ahead of ours. Default 5 min.
  int64_t max_clock_skew_ns = int64_t{300} * 1'000'000'000;

  /// True when the run has no authority: anyone may join (said at start, loopback only).
  bool open() const noexcept { return authority_key.empty(); }
};

/// A signed object as it arrived: the body bytes and the signature, not yet verified.
struct sealed {
  /// The body, a Cap'n Proto flat array.
  std::string body;
  /// The signature (checked to be 64 bytes).
  std::string signature;
};

/// Signs `body` under `domain` with `key` and returns the `Signed` flat array.
std::string seal(std::string_view domain, std::string_view body, const key_pair& key);

/// Parses a `Signed` flat array of at most `max_bytes` (structure only: sizes, alignment,
/// a 64-byte signature, a non-empty body). Refusals are `malformed`.
checked<sealed> unseal(std::string_view bytes, size_t max_bytes, std::string_view what);

/// Writes a `Signed` flat array from a body and a signature as they are (no signing): what a relay
/// forwards, and how tests build forgeries.
std::string pack_sealed(const sealed& s);

/// True when `s.signature` signs `domain ++ s.body` by `public_key`.
bool verify_sealed(std::string_view domain, const sealed& s, std::string_view public_key);

/// Checks an experiment id: 1..128 bytes of printable ASCII without spaces.
status check_experiment_id(std::string_view id);

/// Unix time in nanoseconds as `2026-12-03T15:20:00Z` (UTC), for messages.
std::string format_time(int64_t unix_ns);

} // namespace starling::actors::auth
