// Checkpoint replicas on other nodes (cluster mode): a stage's learned state outlives every node
// that serves the stage, disks included (a region's spot instances reclaimed and replaced by
// fresh machines).
//
// Each node runs one keeper, announced on the replica board (a DHT board whose slot `stages`
// lists the run's keepers and whose slot k lists the holders of stage k's replicas). Every
// `period` a keeper reads the keepers and each stage's live peers; the keepers of the nodes that
// serve no peer of stage k are ranked by a hash of (k, keeper address), and the first `copies`
// keep replicas of k (rendezvous hashing: every keeper computes the same choice on its own). A
// keeper of stage k asks a live peer of k for its step and, when it is ahead of the replica,
// pulls its state (the stage peers' state protocol), writes it as a checkpoint into its folder
// (the same verified format, one file per stage) and serves it from an actor registered as
// `replica-s<k>` and announced in slot k: that actor answers the stage peers' state requests
// (`(get_atom, state_atom)` and parts), so a stage peer that finds no live donor and no
// checkpoint on its own disk downloads the newest replica with the same code that downloads
// from peers (in parts from several holders at once when they hold the same state, verified by
// its digest). A restarted keeper serves the replicas found in its folder.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::stage {

/// Settings of a node's replica keeper.
struct replica_keeper_options {
  /// The stage board (`(get_atom, stage)` lists a stage's live peers as `host:port/name`).
  caf::actor board;
  /// The replica board: a board of `ranges.size() + 1` slots (see the file comment).
  caf::actor replica_board;
  /// This node's `host:port` (the keeper is `<endpoint>/replica-keeper`).
  std::string endpoint;
  /// Layer range of each stage (the checkpoint key of its replicas).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  /// Where the replicas are written (`<run>/<node>/replicas`).
  std::string dir;
  /// Keepers per stage.
  size_t copies = 2;
  /// How often the keeper looks at the stages.
  caf::timespan period = std::chrono::seconds(4);
  /// Timeout of board and peer requests.
  caf::timespan timeout = std::chrono::seconds(10);
  /// Registers an actor in the node's directory under a name (resolvable as
  /// `<endpoint>/<name>`).
  std::function<void(const std::string&, const caf::actor&)> register_actor;
  /// Where replica writes are reported (`messages::metric_event` kind `replica`: stage, steps,
  /// bytes, seconds); unset: nowhere.
  caf::actor metrics;
};

/// The name of the keeper in its node's directory, and of stage `stage`'s replica server.
inline const char* replica_keeper_name = "replica-keeper";
std::string replica_server_name(uint64_t stage);

/// The node endpoint of an actor address `host:port/name` (the part before the last '/').
std::string endpoint_of(const std::string& address);

/// Which of `keepers` (addresses `host:port/name`) keep replicas of `stage`, whose live peers
/// are at `peer_addresses`: the keepers on nodes serving no peer of the stage, ranked by a hash
/// of (stage, address), the first `copies` of them. Pure and the same on every node.
std::vector<std::string> replica_keepers_of(uint64_t stage, const std::vector<std::string>& keepers,
                                            const std::vector<std::string>& peer_addresses,
                                            size_t copies);

/// Spawns a node's keeper (it registers itself and its replica servers through
/// `register_actor` and announces them on the replica board). Its protocol besides its timer:
/// `(status_atom) -> [replicas written, bytes written, stages held]`.
caf::actor spawn_replica_keeper(caf::actor_system& sys, replica_keeper_options opts);

/// The keeper's behaviour (a simulated node spawns it itself).
caf::behavior replica_keeper_actor(caf::event_based_actor* self, replica_keeper_options opts);

} // namespace starling::actors::stage
