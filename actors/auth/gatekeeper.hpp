// The gatekeeper: the first thing a connection meets. It sends a challenge, checks the signed
// hello that must come before any other message (node key, token, this run, this connection),
// then checks every message against the peer's roles, the token's expiry, the deny list and bans.
// Refusals are counted by reason and come with one line for the refused peer. Pure and
// deterministic (clock and randomness passed in), so simulations run the same checks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/auth/deny_list.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/refusal.hpp"
#include "actors/auth/signed.hpp"
#include "actors/auth/token.hpp"

namespace starling::actors::auth {

/// Bytes of a challenge.
inline constexpr size_t challenge_bytes = 32;
/// Largest hello accepted, in bytes.
inline constexpr size_t max_hello_bytes = 8192;

/// The content of a hello, as decoded (structure checked, signature not yet).
struct hello {
  /// The sender's protocol version.
  uint16_t version = 0;
  /// The experiment it wants to join.
  std::string experiment;
  /// Its node public key (32 bytes).
  std::string peer_key;
  /// Its signed token (empty in an open run).
  std::string token;
  /// The acceptor's challenge it answers.
  std::string challenge;
  /// The acceptor's peer id it addresses (20 bytes).
  std::string acceptor_peer_id;
  /// Its clock (Unix ns).
  int64_t time_ns = 0;
};

/// Writes a hello signed by `node` (a `Signed` flat array).
std::string make_hello(const key_pair& node, const hello& h);

/// Parses a signed hello's structure and ranges; refusals are `malformed`.
checked<hello> decode_hello(std::string_view bytes);

/// Who is behind an admitted connection.
struct peer_info {
  /// Node public key.
  std::string peer_key;
  /// Peer id (BLAKE2b-160 of the key).
  std::string peer_id;
  /// Granted roles (`any` for every role; empty for the authority and this node).
  std::vector<std::string> roles;
  /// The token's id (empty without a token).
  std::string token_id;
  /// When the admission ends (the token's expiry; 0: never, in an open run or for admins).
  int64_t expires_at_ns = 0;
  /// This node itself (another process with the same node key): administrative rights.
  bool self = false;
  /// The run's authority: administrative rights.
  bool authority = false;
};

/// Settings of a gatekeeper.
struct gatekeeper_options {
  /// What the run trusts (authority key, experiment, clock skew). Without an authority the run is
  /// open: any node that answers the challenge is admitted with every role but administration.
  trust_anchor trust;
  /// This node's public key.
  std::string self_key;
  /// The protocol version this node speaks.
  uint16_t protocol_version = 0;
  /// Which roles may send which messages: message kind (an envelope payload name such as
  /// `stage.forward`, or a prefix ending in '.' such as `dht.`) to role names; `*` = any admitted
  /// peer. The longest matching entry wins; a kind without an entry is refused. Kinds starting
  /// with `admin.` are only accepted from this node or the authority. Default: `default_policy()`.
  std::map<std::string, std::vector<std::string>> policy;
  /// Fills a buffer with random bytes (challenges). Default: libsodium's randombytes; simulations
  /// pass a seeded generator.
  std::function<void(uint8_t*, size_t)> random;
};

/// The default policy: DHT, transfer control, pings, tensors and replies from any admitted peer;
/// stage passes from trainers (and stages handing state to each other); state downloads from
/// stages; averager messages from the roles that average (stage, averager, collab, dp_peer);
/// MASHA from trainers and data-parallel peers; monitors and validators read through the DHT.
std::map<std::string, std::vector<std::string>> default_policy();

/// The gatekeeper of one node: connections are numbered by the transport.
class gatekeeper {
public:
  /// A gatekeeper with `opts` (an empty policy becomes `default_policy()`).
  explicit gatekeeper(gatekeeper_options opts);

  /// A new connection: returns the challenge to send it. Its first message must be the hello.
  std::string open(uint64_t conn);

  /// The connection is gone.
  void close(uint64_t conn);

  /// The hello of `conn` arrived at `now_ns`: the admitted peer, or the refusal (send its line,
  /// then close). A refused connection stays refused.
  checked<peer_info> admit_hello(uint64_t conn, std::string_view bytes, int64_t now_ns);

  /// A message of `kind` (an envelope payload name, or `admin.<what>`) arrived on `conn`:
  /// the peer it comes from, or the refusal (send its line; `close_after` says whether the
  /// connection must go too).
  checked<const peer_info*> check(uint64_t conn, std::string_view kind, int64_t now_ns);

  /// Installs a newer signed deny list (it must verify and have a higher serial) and returns the
  /// admitted connections it revokes or bans (to be told and closed).
  checked<std::vector<uint64_t>> update_deny_list(std::string_view signed_list, int64_t now_ns);

  /// The current deny list (serial 0 when none was installed).
  const deny_list& current_deny_list() const noexcept { return deny_; }

  /// Refusals by reason.
  const refusal_counts& refusals() const noexcept { return refusals_; }

  /// The public key the last hello proved (its signature verified) when `admit_hello` refused
  /// it nonetheless (banned, revoked, no token...); empty after an admission or when the hello
  /// proved nothing.
  const std::string& refused_key() const noexcept { return refused_key_; }

  /// Connections admitted so far.
  uint64_t admitted() const noexcept { return admitted_; }

  /// Connections open now (challenged or admitted).
  size_t open_connections() const noexcept { return sessions_.size(); }

private:
  enum class state : uint8_t { challenged, admitted, refused };
  struct session {
    state st = state::challenged;
    std::string challenge;
    peer_info peer;
  };

  refusal count(refusal r);
  refusal refuse_session(session& s, refusal r);
  const std::vector<std::string>* rule_for(std::string_view kind) const;

  gatekeeper_options opts_;
  std::string self_peer_id_;
  deny_list deny_;
  std::map<uint64_t, session> sessions_;
  refusal_counts refusals_;
  uint64_t admitted_ = 0;
  std::string refused_key_;
};

} // namespace starling::actors::auth
