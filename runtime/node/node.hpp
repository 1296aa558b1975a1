// A starling node: an actor system with the middleman, a published directory of named actors,
// a resolver that turns peer addresses into handles, and a watcher that reports dead peers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "actors/auth/identity.hpp"
#include "actors/transfer/data_channel.hpp"
#include "kernels/result.hpp"
#include "runtime/config/config.hpp"

namespace starling::messages {
class wire_context;
} // namespace starling::messages

namespace starling::runtime {

class node_gate;

/// Applies starling's settings to a CAF config: message types, scheduler, middleman heartbeat
/// and connection timeout (off by default in CAF 0.17.6). `middleman` is false in simulation.
void configure_system(caf::actor_system_config& cfg, const caf_options& opts, bool middleman);

/// Spawns a directory actor: `(put_atom, name, actor)` registers, `(get_atom, name) -> actor`
/// looks up (an error names the missing actor), `(list_atom) -> vector<string>` lists names.
/// With a `gate`, only actors of this process register, and other processes look up names (and
/// list them) only once their node passed the hello; the gate itself is always found.
caf::actor spawn_directory(caf::actor_system& sys, std::shared_ptr<node_gate> gate = nullptr);

/// Spawns the cluster resolver: `(resolve_atom, "host:port/name") -> actor`. It connects to the
/// node through `connector` (the middleman, or caf_openssl's; once per endpoint), says hello when
/// it has a `gate` (both nodes admit each other; a refusal fails the resolve with its line), asks
/// that node's directory for the name, and fails with a clear error within `timeout`.
/// `(join_atom, "host:port") -> actor` connects the same way and returns the node's directory.
/// With a `gate`, a node that connected here and said hello is reached through that connection
/// (`node_gate::directory_at`); with `defer` as well (TLS), a node dialing a smaller endpoint
/// first waits up to `defer` for that node's own dial to arrive, so that two nodes reaching each
/// other at once open one connection, not two (see `node_gate::add_endpoint`). A dial of an
/// endpoint whose claim the gate is verifying waits for the verification's end.
caf::actor spawn_cluster_resolver(caf::actor_system& sys, caf::actor own_directory,
                                  std::string own_endpoint, caf::timespan timeout,
                                  std::shared_ptr<node_gate> gate = nullptr,
                                  caf::actor connector = {}, caf::timespan defer = {});

/// One node process (or one of several nodes in a test process).
class node {
public:
  /// Called (on an actor thread) when a watched peer node is lost: endpoint and reason.
  using down_callback = std::function<void(const std::string&, const std::string&)>;

  /// Starts the actor system and publishes the directory on `opts.listen`; `configure` adds
  /// settings to the system's config (message types of user roles). The system gets the node's
  /// wire context: envelopes carry `opts.experiment` and the peer id of the key in
  /// `opts.key_file` (created on first start), and arriving ones are checked against them (an
  /// envelope without a sender peer id is refused) and against the node's gate: a sender must
  /// have been admitted by the hello (`runtime/node/gate.hpp`). With `opts.authority` the run is
  /// closed: the node needs `opts.token` (checked here), admits token holders only, and speaks
  /// TLS (caf_openssl) with the token file's certificates unless `opts.tls` is off.
  static result<std::unique_ptr<node>>
  start(const caf_options& caf, const node_options& opts, std::string name,
        const std::function<void(caf::actor_system_config&)>& configure = {});

  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// The node's actor system.
  caf::actor_system& system();
  /// The port the directory is published on (the OS's choice when 0 was asked). In client
  /// mode nothing listens there: it only names the node.
  uint16_t port() const { return port_; }
  /// False in client mode (`node_options::client`): the node accepts no connections.
  bool listening() const { return listening_; }
  /// `host:port` of this node: the advertised endpoint when there is one
  /// (`node_options::advertise`), else where it listens; in client mode the name its peer id
  /// gives (`client_endpoint`, gate.hpp), by which the nodes it connected to reach it.
  std::string endpoint() const;
  /// The node's name for logs.
  const std::string& name() const { return name_; }
  /// The node's peer id (20 bytes: BLAKE2b-160 of its identity's public key).
  const std::string& peer_id() const { return peer_id_; }
  /// The node's identity: names it in envelopes (`peer_id()`), signs its DHT records and gives
  /// its DHT id (the same 160 bits as the peer id).
  const actors::auth::key_pair& key() const { return *key_; }
  /// True when this start created the key file (`node_options::key_file`).
  bool key_created() const { return key_created_; }
  /// The node's wire context: its stamps and the refusals of arriving envelopes by reason.
  const std::shared_ptr<messages::wire_context>& wire() const { return wire_; }
  /// The node's gate: its admissions of other nodes and their refusals by reason.
  const std::shared_ptr<node_gate>& gate() const { return gate_; }
  /// True when the run has no authority (anyone who answers the hello is admitted).
  bool open_run() const;
  /// True when connections are encrypted (caf_openssl).
  bool tls() const { return tls_; }
  /// The experiment id this node's envelopes carry (a token's, in a closed run).
  const std::string& experiment() const { return experiment_; }
  /// The id of this node's token in hex (public: deny lists and `issued.log` name it), empty in
  /// an open run. Never the token itself.
  const std::string& token_id() const { return token_id_; }
  /// The directory actor (published on `port()`).
  caf::actor directory() const;
  /// The resolver every actor of this node uses.
  caf::actor resolver() const;

  /// The node's data endpoint for direct tensor transfers (its direct transport: `link_layer()`);
  /// null when `node_options::data_endpoint` is off or the node listens on the wildcard address.
  std::shared_ptr<actors::transfer::data_endpoint> data_endpoint() const { return data_; }
  /// What seals this node's direct links in a closed run (its key, the experiment, its gate's
  /// admission); null in an open run (plaintext links). Transports the node's actors open on
  /// their own take it too.
  std::shared_ptr<const actors::transfer::link_security> link_security() const {
    return link_security_;
  }

  /// Spawns a transfer receiver delivering to `sink`: direct transfers over the node's data
  /// endpoint when it has one, BASP chunks otherwise. The node stops it on shutdown.
  caf::actor spawn_transfer_receiver(caf::actor sink,
                                     actors::transfer::receiver_options opts = {});

  /// Spawns a transfer sender (data channel first, BASP chunks as fallback). The node stops it
  /// on shutdown.
  caf::actor spawn_transfer_sender(actors::transfer::direct_sender_options opts = {});

  /// Registers `handle` under `name` in this node's directory; the node stops it on shutdown.
  void register_actor(const std::string& name, const caf::actor& handle);

  /// Connects to the node at `endpoint` and watches it; `cb` fires when it is lost.
  /// Returns the peer's directory, or why the connection failed.
  result<caf::actor> join(const std::string& endpoint, down_callback cb);

  /// Stops every actor of the node and the system's network layer. Idempotent.
  void shutdown();

private:
  node() = default;

  std::string name_;
  std::string peer_id_;
  std::shared_ptr<const actors::auth::key_pair> key_;
  bool key_created_ = false;
  std::shared_ptr<messages::wire_context> wire_;
  std::shared_ptr<node_gate> gate_;
  bool tls_ = false;
  std::string experiment_;
  std::string token_id_;
  std::string host_;
  uint16_t port_ = 0;
  bool listening_ = true;
  /// `node_options::advertise`, normalized (empty: none).
  std::string advertised_;
  caf::timespan timeout_{};
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<caf::actor> directory_;
  std::unique_ptr<caf::actor> resolver_;
  std::shared_ptr<actors::transfer::data_endpoint> data_;
  std::shared_ptr<const actors::transfer::link_security> link_security_;
  std::vector<caf::actor> owned_;
  bool stopped_ = false;
};

} // namespace starling::runtime
