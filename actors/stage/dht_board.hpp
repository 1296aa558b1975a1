// The stage board over the DHT: the same protocol as the in-process board (board.hpp), kept in
// the Kademlia DHT so that trainers and stage peers of every node of a cluster (or of a
// simulated world) see each other. Each node runs one.
//
// A stage peer announced on a node is stored as a sub-key of the dictionary record
// `<prefix>/stage<i>`: sub-key = the peer's address `host:port/name` (the caller registers the
// actor under `name` in its node's directory), value = the name; the record is re-stored every
// `announce_period` with expiration now + 2 periods, so a peer whose node dies disappears from the
// DHT within two periods. Reads resolve each address through the node's resolver (cached, and
// monitored: a peer seen dead is not returned again until its record would have expired).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::stage {

/// Settings of a DHT-backed board.
struct dht_board_options {
  /// Key prefix shared by every node of one experiment (e.g. `swarm/<experiment name>`).
  std::string prefix = "swarm";
  /// This node's `host:port`: local peers are announced as `<endpoint>/<name>`.
  std::string endpoint;
  /// Number of pipeline stages (stage indices are checked against it).
  size_t stages = 1;
  /// Re-announcement period; records expire after two periods.
  caf::timespan announce_period = std::chrono::seconds(2);
  /// Timeout of DHT reads and of resolving a peer's address.
  caf::timespan timeout = std::chrono::seconds(5);
};

/// The DHT key of stage `stage`'s peers.
std::string stage_key(const std::string& prefix, size_t stage);

/// Spawns a DHT-backed board speaking the board protocol:
/// - `(put_atom, uint64_t stage, std::string name, caf::actor peer)` announces a local peer
///   (until it dies);
/// - `(get_atom, uint64_t stage) -> (std::vector<std::string>, std::vector<caf::actor>)` lists a
///   stage's live peers (addresses and handles, same order; empty when none is known);
/// - `(list_atom) -> std::vector<uint64_t>` the number of announced peers per stage.
caf::actor spawn_dht_board(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                           dht_board_options opts);

/// The board's behaviour, for spawning on a simulated node.
caf::behavior dht_board_actor(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                              dht_board_options opts);

} // namespace starling::actors::stage
