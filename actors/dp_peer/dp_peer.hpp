// The data-parallel peer (DeDLOC, DiLoCo): the whole model on one peer, trained together with
// peers that come and go. The actor is a thin shell around actors/collab's pure cores: it feeds
// events to the `coordinator` (samples done, progress read, round answers, timers) and carries
// out the effects it returns as its own messages — DHT puts and gets of signed progress records,
// averager requests, optimizer steps, state downloads from donors — on the one `backend` it owns
// (actors/collab/COLLAB.md is the table it follows). No other actor touches its tensors.
//
// Interface:
//   (get_atom, state_atom, uint64_t part, uint64_t parts) -> messages::stage_state_part
//                                          a donor's part of its state (as SWARM stages serve it)
//   (get_atom, state_atom)                 -> messages::stage_state    the whole state
//   (status_atom)                          -> std::vector<uint64_t>    counters (`status_fields`)
//   (stop_atom)                            -> uint32_t   a graceful leave: no new microbatch, the
//                                          averaging round in flight ends (at most its round
//                                          timeout), then the tombstone is stored; the answer is
//                                          how many DHT nodes acknowledged it (0: none, or the
//                                          peer had published no record), and the peer quits
// Exit with `user_shutdown` (a planned leave): the peer withdraws its progress record at once and
// quits; any other exit leaves the record to expire.
//
// Compute: microbatch i lands `compute_time / speed` after microbatch i − 1 (or after the peer
// resumed computing) on CAF's clock, so a simulation charges virtual time and a real run paces
// a fast machine down to its configured speed; the backend computes it when it lands.
// Without delayed updates (`collab.delay_updates`) a peer pauses computing while its step's
// gradient is averaged; with them it keeps computing towards the next step and applies the
// averaged gradient when the round ends (DeDLOC only).
//
// Modes (actors/collab's peer_mode): `full`; `client` (its averager has bandwidth 0: reduces
// nothing and accepts no connection — reducers answer over the links the client opened; it is
// never a donor); `auxiliary` (its averager reduces with weight 0; it computes nothing).
//
// DiLoCo (`algorithm::diloco`): between global steps the peer takes an inner step with its own
// optimizer every `inner_batch` samples; at the global step (the coordinator's round, with the
// target batch counting every peer's samples) the peers average their compressed
// pseudo-gradients (collab::diloco_peer::outgoing: the codec with the peer's error feedback)
// through the averager like DeDLOC's gradients. With Top-k, the rounds are the averager's Top-k
// rounds: the sparse vectors travel as their nonzeros, each part's reducer re-sparsifies the
// part's weighted mean with its own error feedback (actors/averager/sparse_parts.hpp), and every
// member takes the outer step on the same bytes; the bytes counted are the ones the averager
// reports. Other codecs travel dense once decoded (counted at `wire_bytes_per_element`).
//
// Metrics (to the sink, `messages::metric_event`, source = the peer's name):
//   `dp_join`      {generation, mode}               the peer started
//   `dp_step`      {step, samples, averaged, group, contributors, first, last, loss, bytes_sent,
//                   bytes_received, round_s}        an update was taken (samples: own, in it;
//                                                   first/last: its microbatch indices)
//   `dp_dropped`   {first, last, samples}           microbatches that reached no update
//   `dp_eval`      {step, accuracy, loss, bytes_sent}  held-out quality every `eval_every` steps
//   `dp_download`  {step, donors, ok, resync}       a state download ended (resync: the peer had
//                                                   stepped alone and took the state of peers
//                                                   at its step)
//   `dp_leave`     {step}                           the peer left on purpose
//   `dp_credit`    {<partner>: samples, ...}        a gradient round's credits this peer gives
//                                                   its partners (ledger_record.hpp's rule)
//   `dp_serve`     {step, part, parts, ok}          a peer asked this one for (part of) its state
//                                                   (parts 0: the whole state; ok 0: refused, as
//                                                   a client or auxiliary peer refuses)
//
// Ledger (with `ledger_every`): every `ledger_every`, and once more with `left` when it leaves
// on purpose, the peer stores its signed `contribution_summary` under its record id in
// `<ledger_experiment>/ledger/<shard>`, expiring after four periods.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/collab/coordinator.hpp"
#include "actors/collab/diloco.hpp"

namespace starling::actors::dp_peer {

class backend;

/// How the peers train together.
enum class algorithm : uint8_t {
  /// Average gradients at every global step (the collaborative optimizer).
  dedloc,
  /// Inner steps alone, outer steps on averaged compressed pseudo-gradients.
  diloco,
};

/// `dedloc` or `diloco`.
const char* to_string(algorithm a);

/// Settings of one peer.
struct dp_peer_options {
  /// The peer's address as the resolver reaches it (`host:port/name` or `@node/name`): its
  /// progress records carry it (with the node key's owner marker) so that others find donors.
  std::string address;
  /// Name in metrics.
  std::string name;
  /// The collaboration's DHT key prefix: progress under `<prefix>/progress`, averaging groups
  /// under `<prefix>/grad/<step>` and `<prefix>/state/<step>`.
  std::string key_prefix = "dp";
  /// The collaborative optimizer's decisions (target batch, mode, timeouts).
  collab::coordinator_options collab;
  /// DeDLOC or DiLoCo.
  algorithm algo = algorithm::dedloc;
  /// DiLoCo: samples per inner step.
  uint64_t inner_batch = 256;
  /// DiLoCo: the outer optimizer and the pseudo-gradient codec (`inner_steps` is unused: the
  /// coordinator's target batch decides when the outer step comes).
  collab::diloco_options diloco;
  /// Relative compute speed (1 = reference); a microbatch takes `compute_time / speed`.
  double speed = 1.0;
  /// Seconds per microbatch at speed 1 on CAF's clock (0: as long as the backend takes; must
  /// be positive in simulation, where computing takes no virtual time).
  std::chrono::nanoseconds compute_time{0};
  /// Evaluate on held-out data after every this many global steps (0: never).
  uint64_t eval_every = 0;
  /// Timeout of DHT calls and of each donor request.
  std::chrono::nanoseconds rpc_timeout = std::chrono::seconds(5);
  /// Sign progress records with the node's key (the sub-key carries its owner marker).
  bool sign_records = true;
  /// Bytes per element on the wire when averaging (4 for fp32; the kind sets it from the
  /// averager's codec): the byte counts of dp_step.
  double wire_bytes_per_element = 4.0;
  /// Metrics generation (0 = first start).
  int generation = 0;
  /// The contribution ledger (actors/collab/ledger_record.hpp): the experiment whose
  /// `<experiment>/ledger/<shard>` keys the peer's summary goes under, and how often it is
  /// published (0 or an empty experiment: never).
  std::string ledger_experiment;
  std::chrono::nanoseconds ledger_every{0};
  /// In a closed run, its node's token id (hex) for the ledger; empty otherwise.
  std::string token_id;
};

/// Checks `o`: valid coordinator (and DiLoCo) options, a positive speed and inner batch, an
/// address.
status validate(const dp_peer_options& o);

/// What a peer uses of its node.
struct dp_peer_services {
  /// The node's DHT actor.
  caf::actor dht;
  /// The peer's own averager (options matching the peer's mode); unused by DiLoCo.
  caf::actor averager;
  /// `(resolve_atom, address) -> actor` for donors and DiLoCo reducers.
  caf::actor resolver;
  /// The metrics sink (may be invalid: no metrics).
  caf::actor metrics;
};

/// Order of the `(status_atom)` reply's counters.
enum status_fields : size_t {
  st_step,
  st_samples_reported,
  st_samples_averaged,
  st_samples_alone,
  st_samples_dropped,
  st_pending,
  st_in_flight,
  st_rounds,
  st_rounds_averaged,
  st_downloads_done,
  st_bytes_sent,
  st_bytes_received,
  st_microbatches,
  st_count,
};

/// Spawns a peer owning `model`; it starts by asking the DHT for the node's key, then joins.
caf::actor spawn_dp_peer(caf::actor_system& sys, dp_peer_services services,
                         std::shared_ptr<backend> model, dp_peer_options opts);

} // namespace starling::actors::dp_peer
