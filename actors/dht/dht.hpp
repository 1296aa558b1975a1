// The DHT node actor: a thin CAF shell around the routing table, the record store and the
// lookup state machine. Peers reach each other through the node's resolver at `host:port/dht`.
//
// Interface (all replies are asynchronous):
//   dht_request                      -> dht_response     peer RPC (ping/store/find_node/value)
//   dht_put                          -> dht_put_result   store at the key's closest peers
//   (get_atom, std::string key)      -> dht_get_result   find a key's live records
//   (join_atom, std::string address) -> uint32_t         bootstrap from a known peer; peers known
//   (status_atom)                    -> dht_stats        counters
//   (dht_key_atom)                   -> std::string      this node's Ed25519 public key
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "actors/dht/record_store.hpp"
#include "actors/dht/routing_table.hpp"
#include "actors/dht/signing.hpp"

namespace starling::actors::dht {

/// `(ban_atom, public_key) -> uint64_t`: an actor of this node tells its DHT actor that the node
/// verified a ban of that signer itself (BTARD's verdicts): the signer's records held are
/// dropped (their count is the answer), its writes are refused and counted
/// (`dht_stats::rejected_banned`), and lookups ignore its records. Refused from other nodes.
using ban_atom = caf::atom_constant<caf::atom("ban")>;

/// Settings of one DHT node.
struct dht_options {
  /// This node's own address as peers resolve it (`host:port/dht`).
  std::string address;
  /// The node's signing identity; its id is the BLAKE2b of the public key.
  identity id;
  /// Bucket size k, replacement cache, failures before eviction.
  routing_options routing;
  /// Parallel requests per lookup.
  size_t alpha = 3;
  /// Peers each record is stored at.
  size_t num_replicas = 5;
  /// Record size and count limits.
  store_limits limits;
  /// Timeout of one peer RPC (and of resolving a peer).
  caf::timespan rpc_timeout = std::chrono::seconds(2);
  /// Requests accepted per sending peer per second (token bucket, burst = rate); 0 = no limit.
  double requests_per_peer_per_second = 200;
  /// After a successful get, store the value at the closest peer of the path that lacked it.
  bool cache_on_path = true;
  /// Peers to join at start (`host:port/dht`).
  std::vector<std::string> bootstrap;
  /// Client mode (a node others cannot reach, e.g. behind a firewall): it puts and gets through
  /// the others but serves nobody. Its requests name no address, so no peer enters it in a
  /// routing table or picks it as a replica, and it answers any request it gets with a refusal.
  bool client = false;
};

/// The DHT id of a node with public key `public_key`.
node_id id_of(const identity& id);

/// Spawns a DHT node that reaches peers through `resolver` (`(resolve_atom, address) -> actor`).
caf::actor spawn_dht(caf::actor_system& sys, caf::actor resolver, dht_options opts);

/// The behaviour of a DHT node, for spawning through a simulation node or a custom spawner.
caf::behavior dht_actor(caf::event_based_actor* self, caf::actor resolver, dht_options opts);

} // namespace starling::actors::dht
