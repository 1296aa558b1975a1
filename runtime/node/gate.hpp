// A node's gate on live connections: the actor other nodes say hello to, the handshake a node runs
// before it uses a connection it opened, and the list of CAF nodes admitted so far (the directory
// answers lookups only to them). The checks themselves are `actors::auth::admission`'s; envelopes
// from senders it has not admitted are refused on arrival (`wire_reason::unauthorized`).
//
// The hello exchange travels as plain CAF messages (strings and a number), not in envelopes: each
// hello is itself a signed, versioned Cap'n Proto object bound to the acceptor and its challenge,
// checked by the gatekeeper before anything else is accepted from its sender. The endpoint a
// connector names in its hello (so that the acceptor reaches it through that connection) is kept
// only once a probe found the connector's node listening there (`listener_probe.hpp`).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <map>
#include <set>
#include <vector>
#include <string>
#include <string_view>
#include <utility>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/actor_addr.hpp>
#include <caf/node_id.hpp>

#include "actors/auth/admission.hpp"
#include "runtime/node/listener_probe.hpp"

namespace starling::runtime {

/// `(hello_atom, peer_id, challenge) -> (session, challenge, hello)` opens an admission;
/// `(hello_atom, session, hello, connector's gate) -> refusal line` (empty: admitted) completes
/// it; `(hello_atom, session, hello, connector's gate, its endpoint, its directory)` completes it
/// too, and once the acceptor verified that the connector's node listens at that endpoint (the
/// answer waits for it) it reaches the connector through this connection (see
/// `node_gate::directory_at`); `(hello_atom, session, hello, connector's gate, its directory)`
/// is a client-mode connector's: the acceptor reaches it through this connection under
/// `client_endpoint(its peer id)`, with no probe.
using hello_atom = caf::atom_constant<caf::atom("hello")>;
/// `(deny_atom, signed deny list) -> serial in force`: installs a newer deny list (from anyone:
/// only the authority can sign one) and passes it on to the gates of the nodes admitted both
/// ways, which pass it on in turn until every node has it (an older or equal list stops there).
using deny_atom = caf::atom_constant<caf::atom("deny")>;

/// The name of a node's gate in its directory.
inline constexpr const char* gate_name = "gate";

/// Why the endpoint a connector claimed in its hello was not kept (the connector stays
/// admitted; the acceptor dials that endpoint itself when it needs it).
enum class claim_refusal : uint8_t {
  /// Not `host:port`, or the directory it named is not on the connector's node.
  malformed = 0,
  /// Another live node's verified claim holds the endpoint.
  taken,
  /// A claim of that endpoint is being verified already, or too many probes are running.
  busy,
  /// The probe learned nothing there: nothing listens, not the run's TLS, not a CAF node, or too
  /// slow.
  unreachable,
  /// The node listening there is another CAF node than the connector.
  other_node,
  /// Under TLS, the listener's certificate certifies another key than the one the connector
  /// was admitted with.
  other_key,
};

/// The endpoint a client-mode node goes by: `<hex of its peer id>.client.invalid:1`. Nothing
/// listens there (`.invalid` never resolves, RFC 6761); the name is bound to the key the node's
/// hellos prove, so no probe verifies it: a node the client connected to reaches it through that
/// connection by this name (`node_gate::directory_at`), and any other node fails at once instead
/// of dialing. Slot claims, stage records and averager addresses carry it like any endpoint: the
/// others address a client-mode node by its peer id, not by where it is.
std::string client_endpoint(const std::string& peer_id);
/// True for a name `client_endpoint` makes.
bool is_client_endpoint(const std::string& endpoint);

/// Number of claim refusal reasons.
inline constexpr size_t claim_refusal_count = static_cast<size_t>(claim_refusal::other_key) + 1;

/// The stable name of a claim refusal reason (`"other_node"`...).
std::string_view to_string(claim_refusal r);

/// What became of the endpoint a connector claimed in its hello.
struct claim_verdict {
  /// The endpoint it claimed.
  std::string endpoint;
  /// True when a probe found the connector listening there (others can dial it).
  bool kept = false;
  /// Why not (`unreachable: ...`), empty when kept.
  std::string why;
};

/// What a node's gate, directory and resolver share.
class node_gate {
public:
  /// A gate deciding with `admission`.
  explicit node_gate(std::shared_ptr<actors::auth::admission> admission)
    : admission_(std::move(admission)) {}

  /// The admission checks.
  actors::auth::admission& admission() { return *admission_; }

  /// Marks the CAF node `n` as admitted: it passed the hello as peer `peer_id`.
  void admit_node(const caf::node_id& n, const std::string& peer_id);
  /// True when `n` passed the hello (or is this process's own node).
  bool node_admitted(const caf::node_id& n) const;
  /// Forgets `n` (a deny list revoked its peer, or it went away), its gate and its endpoint.
  void forget_node(const caf::node_id& n);

  /// Remembers that the admitted node `n`, which connected to this one, publishes its
  /// directory `dir` at `endpoint` (`host:port`, as its hello said, verified by the gate: a probe
  /// found `n` listening there). The resolver then reaches that endpoint through the connection
  /// `n` opened instead of opening a second one: CAF 0.17 closes the second BASP connection
  /// between two nodes as redundant, and with caf_openssl that close took the first connection's
  /// route down with it (every handle of the other node failed as unreachable, and the two nodes
  /// kept reconnecting). False (nothing kept) when `n` is not admitted, `dir` is not on `n`, or
  /// another live node's claim holds it (a `client_endpoint` name goes to the latest node).
  bool add_endpoint(const caf::node_id& n, const std::string& endpoint, const caf::actor& dir);
  /// The node whose kept claim holds `endpoint` (none when no claim is kept).
  caf::node_id claimant_of(const std::string& endpoint) const;

  /// How claims are verified (`probe_listener`'s settings: its time limit, and under TLS this
  /// node's certificate, key and the run's CA). Set before the gate is spawned.
  void set_probe_options(probe_options opts);
  /// Those settings.
  probe_options probe_settings() const;
  /// Marks a claim of `endpoint` as being verified and counts its probe: false when a claim of
  /// `endpoint` is being verified already, or when `max_probes` probes are running.
  bool begin_claim(const std::string& endpoint);
  /// The verification of `endpoint`'s claim ended (kept or not; its probe may run on).
  void end_claim(const std::string& endpoint);
  /// A probe counted by `begin_claim` returned.
  void probe_done();
  /// True while a claim of `endpoint` is being verified (the resolver waits for it before it
  /// dials that endpoint).
  bool claim_pending(const std::string& endpoint) const;
  /// Counts a kept claim.
  void count_claim_kept();
  /// Counts a refused claim.
  void count_claim_refused(claim_refusal why);
  /// Remembers the verdict on the claim of the admitted node `n` (the latest one).
  void set_verdict(const caf::node_id& n, claim_verdict v);
  /// The verdict on `n`'s claim, if it made one (a joiner learns it: runtime/experiment/serve).
  std::optional<claim_verdict> verdict_of(const caf::node_id& n) const;
  /// Claims kept so far.
  uint64_t claims_kept() const;
  /// Claims refused for `why` so far.
  uint64_t claims_refused(claim_refusal why) const;
  /// Claims refused so far, every reason.
  uint64_t claims_refused() const;

  /// Probes running at once at most (each holds a thread); beyond, a claim is refused as `busy`.
  static constexpr size_t max_probes = 16;
  /// The directory of the admitted node that said it publishes at `endpoint`, or an invalid
  /// handle.
  caf::actor directory_at(const std::string& endpoint) const;

  /// The resolver whose waits for an endpoint end when that endpoint's node said hello here
  /// (`(hello_atom, endpoint)`, see `spawn_cluster_resolver`).
  void set_resolver(const caf::actor& resolver);
  /// That resolver, or an invalid handle.
  caf::actor resolver() const;

  /// This node's endpoint and directory, sent along with this node's hellos. `listening` false
  /// (client mode: nothing listens there): the hellos claim no endpoint, so no gate probes it,
  /// and the nodes this one reaches answer over the connections it opened.
  void set_own_directory(const std::string& endpoint, const caf::actor& dir,
                         bool listening = true);
  /// False in client mode (see `set_own_directory`).
  bool listening() const;
  /// This node's endpoint (empty until set).
  std::string own_endpoint() const;
  /// This node's directory, or an invalid handle.
  caf::actor own_directory() const;

  /// Remembers the gate of node `n` (deny lists are passed on to it).
  void add_gate(const caf::node_id& n, const caf::actor& gate);
  /// The gates of other nodes known so far.
  std::vector<caf::actor> gates() const;

  /// This node's own gate (set once it is spawned; sent along with this node's hellos).
  void set_own_gate(const caf::actor& gate);
  /// This node's own gate, or an invalid handle.
  caf::actor own_gate() const;

  /// Installs a newer signed deny list: true when it was taken (then it is kept to pass on),
  /// false with the refusal's line when not.
  bool install_deny_list(const std::string& signed_list, std::string& why);
  /// The signed deny list in force (empty when none).
  std::string deny_list() const;

  /// Bans the node key `node_key` by a verdict this node verified itself (actors/auth/
  /// ban_service.hpp): beside the deny list, the admitted peers of that key lose their session,
  /// directory access and gate; later hellos and envelopes are refused as `banned`. Returns how
  /// many admitted peers it removed.
  size_t ban_verified(const std::string& node_key, const std::string& why);

private:
  /// Forgets the CAF nodes of `peers` (their gates and endpoints too). Holds `mtx_`.
  void drop_peers(const std::vector<std::string>& peers);

  std::shared_ptr<actors::auth::admission> admission_;
  mutable std::mutex mtx_;
  /// Admitted CAF nodes and the peer id each said hello as.
  std::map<caf::node_id, std::string> nodes_;
  std::map<caf::node_id, caf::actor_addr> gates_;
  caf::actor_addr own_gate_;
  /// Endpoints that admitted nodes said they publish their directories at.
  std::map<std::string, std::pair<caf::node_id, caf::actor_addr>> endpoints_;
  /// Endpoints whose claims are being verified.
  std::set<std::string> pending_claims_;
  /// Probes running (a probe may outlive its verification, see probe_options::tls_grace).
  size_t probes_ = 0;
  probe_options probe_;
  uint64_t claims_kept_ = 0;
  std::array<uint64_t, claim_refusal_count> claims_refused_{};
  std::string own_endpoint_;
  bool listening_ = true;
  caf::actor_addr resolver_;
  caf::actor_addr own_directory_;
  std::string deny_list_;
  std::map<caf::node_id, claim_verdict> verdicts_;
};

/// Spawns the gate of a node: answers the two hello messages and installs deny lists that
/// verify and are newer than the one in force. An endpoint claimed in a hello is kept only once
/// a probe (`probe_listener`, on a detached actor of its own) found the connector's node
/// listening there (and under TLS showing a certificate of the key it was admitted with); the
/// answer to that hello waits for the probe. A refused claim is counted by reason
/// (`node_gate::claims_refused`) and logged in one line; the connector stays admitted.
caf::actor spawn_gate(caf::actor_system& sys, std::shared_ptr<node_gate> gate);

/// Runs the handshake with the node whose directory is `remote_dir`, from `self`: asks for its
/// gate, admits it (its hello must answer this node's challenge), then sends this node's hello.
/// `done` gets an empty string when both sides admitted each other, else one line saying why not.
void say_hello(caf::event_based_actor* self, caf::actor remote_dir,
               std::shared_ptr<node_gate> gate, caf::timespan timeout,
               std::function<void(std::string)> done);

} // namespace starling::runtime
