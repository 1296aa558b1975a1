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
  /// How long a throughput report stays in the DHT (peers report more often than this).
  caf::timespan load_ttl = std::chrono::seconds(90);
  /// How long a migration claim waits between storing itself and reading the claims back: claims
  /// stored within this window of each other all see each other (it must exceed a store's
  /// latency; keep it well below the claimants' request timeout).
  caf::timespan claim_settle = std::chrono::milliseconds(500);
};

/// The DHT key of stage `stage`'s peers.
std::string stage_key(const std::string& prefix, size_t stage);

/// Spawns a DHT-backed board speaking the board protocol:
/// - `(put_atom, uint64_t stage, std::string name, caf::actor peer)` announces a local peer
///   (until it dies);
/// - `(get_atom, uint64_t stage) -> (std::vector<std::string>, std::vector<caf::actor>)` lists a
///   stage's live peers (addresses and handles, same order; empty when none is known);
/// - `(list_atom) -> std::vector<uint64_t>` the number of announced peers per stage;
/// and the rebalancing messages of board.hpp, kept in dictionary records next to the stage's:
/// - `<prefix>/stage<i>/load`: sub-key = a live peer's address, value "<throughput> <queue>"
///   (`encode_load_report`), expiring after `load_ttl`; reports of peers not in the stage's
///   record are ignored;
/// - `<prefix>/stage<i>/joining`: sub-key = a unique id of this board, value = the expected
///   throughput, expiring after the hold; when a local peer announces itself in that stage, the
///   board's oldest joiner there is overwritten with "done" (a later expiration wins) so that it
///   is not counted twice;
/// - `<prefix>/stage<i>/migration`: a claim stores a sub-key of this board expiring after the
///   period, reads the record back after `claim_settle` and is granted when fewer than `slots`
///   unexpired claims have a smaller (expiration, sub-key): the first `slots` claims of a period
///   win (one without `slots`), later ones see them and lose, and claims made within
///   `claim_settle` of each other see each other.
///   Agreement holds as far as the DHT's replicas agree (a claim stored while a partition hides
///   the earlier one is granted too).
/// Totals and placement follow `total_of` and `stage_for_newcomer` (load_view.hpp).
caf::actor spawn_dht_board(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                           dht_board_options opts);

/// The board's behaviour, for spawning on a simulated node.
caf::behavior dht_board_actor(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                              dht_board_options opts);

} // namespace starling::actors::stage
