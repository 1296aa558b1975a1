// Why a token, a deny list, a hello or a message was refused: one closed set of reasons, so that
// every refusal is counted by reason and told to the refused peer in one line.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace starling::actors::auth {

/// A reason for refusing; each has a stable name used in counters and the refusal line.
enum class reason : uint8_t {
  /// Bytes that do not parse, or fields out of range.
  malformed = 0,
  /// A signature that does not verify with the key it claims.
  forged,
  /// Signed by another authority than this run's.
  wrong_authority,
  /// Issued for another experiment (run).
  foreign_experiment,
  /// The token's expiry has passed.
  expired,
  /// Issued in the future (beyond the allowed clock skew).
  not_yet_valid,
  /// A valid token presented by a node whose key is not the token's.
  wrong_key,
  /// The token is on the deny list.
  revoked,
  /// The peer's key is on the deny list.
  banned,
  /// The peer sent something other than a hello first.
  no_hello,
  /// A hello of another protocol version.
  version_mismatch,
  /// A hello that answers another connection's challenge, or another acceptor.
  wrong_challenge,
  /// A hello whose clock is too far from ours.
  stale,
  /// A token is required (the run has an authority) and none came.
  no_token,
  /// The peer's roles do not allow this message.
  role_denied,
  /// A second hello on an admitted connection, or a message after a refusal.
  protocol_violation,
};

/// Number of reasons.
inline constexpr size_t reason_count = static_cast<size_t>(reason::protocol_violation) + 1;

/// The stable name of a reason (`"expired"`, `"role_denied"`...).
std::string_view to_string(reason r);

/// A refusal: its reason and a one-line detail for the refused peer and the log.
struct refusal {
  /// The counted reason.
  reason why = reason::malformed;
  /// What was expected and what came; one line, no secrets.
  std::string detail;

  /// `"refused (<reason>): <detail>"`, the line sent to the refused peer.
  std::string line() const;
};

/// Either a `T` or a `refusal` (the `result` of checks whose failures are counted by reason).
template <class T>
class checked {
public:
  checked(T value) : v_(std::move(value)) {}
  checked(refusal r) : v_(std::move(r)) {}
  /// True when a value is held.
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  /// The value; only valid when `ok()`.
  T& operator*() & { return std::get<0>(v_); }
  /// The value; only valid when `ok()`.
  const T& operator*() const& { return std::get<0>(v_); }
  /// The value's members; only valid when `ok()`.
  T* operator->() { return &std::get<0>(v_); }
  /// The value's members; only valid when `ok()`.
  const T* operator->() const { return &std::get<0>(v_); }
  /// The refusal; only valid when `!ok()`.
  const refusal& error() const { return std::get<1>(v_); }

private:
  std::variant<T, refusal> v_;
};

/// Shorthand for a refusal.
inline refusal refuse(reason why, std::string detail) {
  return refusal{why, std::move(detail)};
}

/// Refusals counted by reason.
class refusal_counts {
public:
  /// Counts one refusal.
  void add(reason r) { ++counts_[static_cast<size_t>(r)]; }
  /// Adds every count of `other`.
  void merge(const refusal_counts& other) {
    for (size_t i = 0; i < reason_count; ++i)
      counts_[i] += other.counts_[i];
  }
  /// Refusals of reason `r` so far.
  uint64_t of(reason r) const { return counts_[static_cast<size_t>(r)]; }
  /// All refusals so far.
  uint64_t total() const;
  /// `"expired=2 forged=1"`: the non-zero counts in reason order; empty when none.
  std::string summary() const;

private:
  std::array<uint64_t, reason_count> counts_{};
};

/// What one node refused of one party whose key it knew (the key a hello proved, or the one it
/// was admitted with).
struct peer_refusals {
  /// Its 32-byte public key.
  std::string peer_key;
  /// Its refusals by reason.
  refusal_counts counts;
  /// Why it is out of the run, in the refusal's words (the deny list's or the token's reason),
  /// set by a `banned` or `revoked` refusal; empty otherwise.
  std::string ban_reason;
};

/// Refusals by peer id, bounded: at most `max_peers` parties keep counts of their own. A new one
/// beyond the bound takes the place of the one with the fewest refusals (one with a ban reason
/// last), whose counts move to `other`: the parties refused most stay listed.
class peer_refusal_tally {
public:
  /// Longest ban reason kept, in bytes.
  static constexpr size_t max_reason_bytes = 300;

  /// A tally of at most `max_peers` (at least 1) parties.
  explicit peer_refusal_tally(size_t max_peers = 64);
  /// Counts `r` for the party of `peer_id` whose public key is `peer_key`.
  void add(std::string_view peer_id, std::string_view peer_key, const refusal& r);
  /// The listed parties by peer id.
  const std::map<std::string, peer_refusals, std::less<>>& peers() const noexcept {
    return peers_;
  }
  /// The refusals of parties no longer listed.
  const refusal_counts& other() const noexcept { return other_; }

private:
  size_t max_peers_;
  std::map<std::string, peer_refusals, std::less<>> peers_;
  refusal_counts other_;
};

} // namespace starling::actors::auth
