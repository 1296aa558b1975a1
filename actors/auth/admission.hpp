// A node's admission of other nodes on live connections: the gatekeeper core made thread-safe and
// keyed by peer id, with this node's own side of the hello (it signs its hellos with its key and
// shows its token). Two nodes admit each other in one exchange (see runtime/node's gate actor):
//   A -> B  open(challenge_A)        B opens a session, answers with its challenge and its hello
//   B -> A  (session, challenge_B, hello_B answering challenge_A)   A admits B
//   A -> B  (session, hello_A answering challenge_B)                B admits A, says yes or why not
// After that, every envelope from A is checked on arrival at B (`allow`): the sender must have been
// admitted, its token must not have expired or been revoked, and its roles must allow the
// payload's kind. No CAF or torch: the envelope decoder calls `allow` on CAF's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/auth/gatekeeper.hpp"

namespace starling::actors::auth {

/// Settings of a node's admission.
struct admission_options {
  /// What the run trusts; without an authority key the run is open (any node that answers the
  /// challenge is admitted, with every role but administration).
  trust_anchor trust;
  /// This node's key: signs its hellos, and a peer with the same key is this node (admin rights).
  std::shared_ptr<const key_pair> key;
  /// This node's signed token (empty in an open run; required in a run with an authority).
  std::string token;
  /// The protocol version both sides must speak.
  uint16_t protocol_version = 0;
  /// Message kinds to roles (see `gatekeeper_options::policy`); empty: `default_policy()`.
  std::map<std::string, std::vector<std::string>> policy;
  /// The clock (Unix ns); empty: the system clock. Simulations pass their virtual clock.
  std::function<int64_t()> clock;
  /// Random bytes for challenges; empty: libsodium's. Simulations pass a seeded generator.
  std::function<void(uint8_t*, size_t)> random;
  /// Sessions opened but not completed that are kept; beyond, the oldest is dropped (a flood of
  /// opened handshakes cannot grow memory). Default 4096.
  size_t max_pending = 4096;
  /// Refused parties counted by peer id (`admission::refused_peers`); beyond, the ones refused
  /// least are summed. Default 64.
  size_t max_refused_peers = 64;
};

/// Checks this node's own credentials against `opts` before it starts: in a run with an authority
/// the token must verify (authority, experiment, expiry) and belong to the node's key.
status check_own_token(const admission_options& opts);

/// One node's admissions. Thread-safe.
class admission {
public:
  /// What `open` returns to the node that asked.
  struct opening {
    /// The session the hello must name.
    uint64_t session = 0;
    /// The challenge the asking node's hello must answer.
    std::string challenge;
    /// This node's hello, answering the asking node's challenge.
    std::string hello;
  };

  /// An admission with `opts` (its key must be set).
  explicit admission(admission_options opts);

  /// This node's peer id.
  const std::string& peer_id() const noexcept { return peer_id_; }
  /// True when the run has no authority.
  bool open_run() const noexcept { return opts_.trust.open(); }
  /// The clock's reading (Unix ns).
  int64_t now() const;

  /// A fresh challenge for a connection this node opens to another (the other's hello must
  /// answer it); `session` names it in `admit_acceptor`.
  std::string begin(uint64_t& session);

  /// Another node (peer id `their_peer_id`) asks to be admitted and sends `their_challenge`:
  /// returns a session, a challenge for its hello and this node's hello answering theirs.
  opening open(std::string_view their_challenge, std::string_view their_peer_id);

  /// The hello of the node that asked (`open`) arrived for `session`: admitted, or the refusal
  /// (its line goes back to that node).
  checked<peer_info> admit(uint64_t session, std::string_view hello);

  /// The acceptor's hello arrived for the connection this node opened (`begin`): the acceptor is
  /// admitted too, or refused (then this node does not go on).
  checked<peer_info> admit_acceptor(uint64_t session, std::string_view hello);

  /// What the hello of an acceptor of another experiment said of its run.
  struct foreign_run {
    /// The experiment id its hello named (empty: no acceptor was refused for its experiment).
    std::string experiment;
    /// True when its hello showed a token: a closed run (its nodes admit token holders only).
    bool closed = false;
  };
  /// What the hello of the last acceptor this node refused for naming another experiment than
  /// this node's (`foreign_experiment`) said of its run. Not verified (the hello's signature is
  /// checked after its experiment): what the node reached says of itself. A joiner of an open
  /// run, which does not know the run's id before it is admitted, learns it from here and starts
  /// its node again with it (runtime/cli/join_cmd). Taken: the next call says nothing until
  /// another such acceptor is refused.
  foreign_run take_foreign_acceptor();

  /// This node's hello answering `challenge` from the node of peer id `acceptor_peer_id`.
  std::string hello_for(std::string_view challenge, std::string_view acceptor_peer_id) const;

  /// May the node of peer id `sender` send a message of `kind` now? Nothing when it may; the
  /// refusal (counted) when it has not been admitted, its token expired or was revoked, or its
  /// roles do not allow `kind`.
  std::optional<refusal> allow(std::string_view sender, std::string_view kind);

  /// May the node of peer id `sender` send anything now (admitted, token unexpired and not
  /// revoked; roles not checked)? What a simulated link checks, where payload kinds are not
  /// named. Nothing when it may; the refusal (counted) when not.
  std::optional<refusal> allow_any(std::string_view sender);

  /// The admitted peer of `peer_id`, if any.
  std::optional<peer_info> peer(std::string_view peer_id) const;
  /// The node key `peer_id` was admitted with (empty when it is not admitted now).
  std::string key_of(std::string_view peer_id) const;

  /// Installs a newer signed deny list; returns the peer ids it removes (revoked or banned).
  checked<std::vector<std::string>> update_deny_list(std::string_view signed_list);

  /// The serial of the deny list in force (0: none).
  uint64_t deny_serial() const;

  /// Bans the node key `node_key` by a verdict this node verified itself (BTARD's peers decide
  /// bans without the authority; beside the authority's deny list): the peer admitted with that
  /// key loses its session, and its later hellos and messages are refused as `banned` (counted)
  /// with `why`, for as long as this admission lives — a restart with the same key stays
  /// refused. Returns the peer ids it removed.
  std::vector<std::string> ban_verified(std::string_view node_key, std::string why);
  /// Why `node_key` is banned by this node's own verdict (none when it is not).
  std::optional<std::string> verified_ban(std::string_view node_key) const;

  /// Refusals by reason.
  refusal_counts refusals() const;
  /// Refusals of the parties whose key was known (a hello that proved it, or a peer admitted
  /// before), by peer id and reason, with why a banned or revoked one is out of the run. A
  /// sender never admitted is counted by reason only: the peer id it names proves nothing.
  peer_refusal_tally refused_peers() const;
  /// `"no_hello=2 expired=1"` (empty when none).
  std::string summary() const;
  /// Peers admitted so far (admissions, not distinct peers).
  uint64_t admitted() const;

private:
  /// The refusal of a sender not admitted now (never, or no longer); counted. Holds `mtx_`.
  refusal not_admitted(std::string_view sender, std::string_view what);

  admission_options opts_;
  std::string peer_id_;
  mutable std::mutex mtx_;
  gatekeeper keeper_;
  uint64_t next_session_ = 1;
  /// Sessions this node opened (as acceptor) and not yet completed, oldest first.
  std::vector<uint64_t> pending_;
  struct admitted_peer {
    uint64_t session = 0;
    peer_info info;
  };
  /// Admitted peers by peer id.
  std::map<std::string, admitted_peer, std::less<>> by_peer_;
  /// Refusals of senders that never were admitted (the gatekeeper counts the rest).
  refusal_counts strangers_;
  /// Peers refused after admission (expired, revoked, banned): kept so `allow` says why, with
  /// the key they were admitted with.
  struct gone_peer {
    refusal why;
    std::string key;
  };
  std::map<std::string, gone_peer, std::less<>> gone_;
  /// Node keys banned by this node's own verdicts, and why.
  std::map<std::string, std::string, std::less<>> verified_bans_;
  /// Refusals of parties whose key was known.
  peer_refusal_tally refused_peers_;
  /// See `take_foreign_acceptor`.
  foreign_run foreign_acceptor_;
};

/// The whole exchange between two admissions in one process (simulations, tests): `connector`
/// admits `acceptor` by its hello, then `acceptor` admits `connector`. Empty when both did, else
/// the refusal's line (prefixed "the node refused here: " when the connector refused).
std::string handshake(admission& connector, admission& acceptor);

} // namespace starling::actors::auth
