// What a watched run looks like at one moment: a versioned, immutable snapshot built from the
// run's metric stream by a pure builder (no CAF, no I/O), and the store that hands the latest one
// to the HTTP handlers. `/metrics` and `/status` both render one snapshot, so two answers with
// the same version hold the same numbers.
//
// Rules the builder keeps (tests/runtime/observe/snapshot_test.cpp checks them):
// - Counters only grow: every `_total` number of a later snapshot is >= the earlier one's.
// - Label sets are bounded and sticky: the first `max_peers` peers that report work get their own
//   series, every later one is summed into `peer="other"`; likewise event kinds (`max_kinds`) and
//   refusal reasons (`max_reasons`). A label once given keeps its series, so the `other` sums
//   never decrease (ranking by size would move peers in and out of `other`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/observe/ledger.hpp"

namespace starling::runtime::observe {

/// One planned role instance (from the run's plan).
struct planned_member {
  /// `<role>.<index>`.
  std::string name;
  std::string role;
  size_t node = 0;
  /// Run time at which it starts, and leaves on purpose (negative: never).
  double start_s = 0;
  double leave_s = -1;
  /// The role's registered type (`swarm.stage`, `dedloc.peer`).
  std::string type;
};

/// The run being watched.
struct run_description {
  std::string experiment;
  std::string kind;
  std::string mode;
  size_t nodes = 0;
  uint64_t seed = 0;
  /// Wall-clock start, seconds since the Unix epoch.
  double start_unix_s = 0;
  std::vector<planned_member> members;
  /// The folder whose SVG pictures the page shows (the run's output; empty: none). Served
  /// files only, never shown as a path.
  std::string pictures_dir;
};

/// One metric event as the builder reads it (a view: it copies what it keeps).
struct event_view {
  /// Run time in seconds.
  double t = 0;
  size_t node = 0;
  const std::string& source;
  const std::string& kind;
  const std::map<std::string, double>& values;
  const std::map<std::string, std::string>& labels;
};

/// One instance as the page lists it.
struct member_state {
  std::string name;
  std::string role;
  /// What else the page says about it: a SWARM stage peer's stage (`stage 2`), a data-parallel
  /// peer's mode (`client mode`); empty when nothing.
  std::string detail;
  size_t node = 0;
  bool live = false;
  /// Run time of its last event (negative: none yet).
  double last_seen_s = -1;
  /// Samples it processed.
  double samples = 0;
  /// Restarts of this instance.
  uint64_t restarts = 0;
};

/// The run at one moment. Plain data: copy it, render it, compare it.
struct snapshot {
  /// Grows by one with every published snapshot (0: nothing published yet).
  uint64_t version = 0;
  run_description run;
  /// Run time of the latest event or tick, seconds.
  double run_time_s = 0;
  /// True once the run ended (its reporters are finishing).
  bool finished = false;

  // -- counters (never decrease) --------------------------------------------------------------
  uint64_t events_total = 0;
  /// Events by kind (bounded; the rest under "other").
  std::map<std::string, uint64_t> events_by_kind;
  /// Samples processed (microbatches of trainers, steps of data-parallel peers).
  double samples_total = 0;
  uint64_t microbatches_total = 0;
  /// Averaging rounds by outcome: `averaged` (with partners) or `alone`.
  std::map<std::string, uint64_t> rounds_by_outcome;
  /// Retries of microbatches.
  uint64_t retries_total = 0;
  /// Restarts of instances and of nodes.
  uint64_t restarts_total = 0;
  /// Faults by action (`kill_instance` = preemptions, `kill_node`, ...).
  std::map<std::string, uint64_t> faults_by_action;
  uint64_t joins_total = 0;
  uint64_t leaves_total = 0;
  /// Samples dropped (computed but not averaged).
  double dropped_samples_total = 0;
  /// Refused envelopes by reason (bounded; the rest under "other").
  std::map<std::string, uint64_t> refusals_by_reason;
  /// Samples per peer (bounded, sticky; the rest under "other").
  std::map<std::string, double> peer_samples_total;
  /// Samples whose backward each SWARM stage applied, by stage index (bounded: `max_stages`),
  /// from the stage peers' ledger summaries.
  std::map<std::string, double> stage_samples_total;
  /// Bytes each peer sent and received averaging, from the ledger's rows (bounded and sticky as
  /// `peer_samples_total`: the first `max_peers` rows, the rest under "other").
  std::map<std::string, double> peer_bytes_sent_total;
  std::map<std::string, double> peer_bytes_received_total;
  /// Peers the run banned (the ledger's banned rows: verdicts, the gates' bans and revocations).
  uint64_t bans_total = 0;
  /// Samples accepted: what round partners credited the peers with (the ledger's `accepted`
  /// summed; a peer's own claim counts nothing).
  double samples_accepted_total = 0;

  // -- gauges ---------------------------------------------------------------------------------
  /// Samples per second over the last `rate_window_s` of run time.
  double samples_per_second = 0;
  /// Samples per second of each peer of `peer_samples_total` (same labels) over the last
  /// `rate_window_s`.
  std::map<std::string, double> peer_samples_per_second;
  /// Samples per second of each stage of `stage_samples_total` over the last
  /// `stage_rate_window_s` (summaries come every `node.ledger_every`).
  std::map<std::string, double> stage_samples_per_second;
  /// Latest training loss (NaN before the first).
  double loss;
  /// Highest global step seen (-1: none).
  double global_step = -1;
  /// Live instances by role (every planned role present, 0 when none lives).
  std::map<std::string, uint64_t> live_by_role;
  /// Live data-parallel peers by mode: `full` (reachable, averages and donates state) and
  /// `client` (dials out only), from their joins; both present once any peer said its mode.
  std::map<std::string, uint64_t> live_by_mode;
  /// Every instance (planned ones first; bounded).
  std::vector<member_state> members;
  /// (run time, loss) points, thinned to at most `max_curve_points`.
  std::vector<std::pair<double, double>> loss_curve;
  /// The contribution ledger (ledger.hpp): every peer seen, from the metric stream and the
  /// peers' summaries in the DHT.
  std::vector<ledger_row> ledger;

  snapshot();
};

/// What the serving node's gate refused (runtime/node/gate.hpp), as it counts it now.
struct gate_refusals {
  /// Refusals by reason (the gate's closed set of reasons: `expired`, `banned`...).
  std::map<std::string, uint64_t> by_reason;
  /// The parties whose key it knew (bounded by the gate).
  std::vector<gate_refused_peer> peers;
};

/// Limits of a builder.
struct builder_options {
  size_t max_peers = 20;
  size_t max_kinds = 32;
  size_t max_reasons = 16;
  size_t max_members = 1000;
  size_t max_curve_points = 512;
  double rate_window_s = 10;
  /// Stages with their own series (SWARM), and the window of their rates.
  size_t max_stages = 64;
  double stage_rate_window_s = 30;
  /// Rows of the contribution ledger (later peers summed into `other`).
  size_t max_ledger_rows = 4096;
};

/// Folds metric events into the current state and makes snapshots of it. Not thread-safe: one
/// caller at a time (the metric hub holds its lock).
class snapshot_builder {
public:
  explicit snapshot_builder(run_description run, builder_options opts = {});

  /// One metric event.
  void add(const event_view& e);
  /// Run time passed without events (keeps rates and liveness current).
  void advance(double t);
  /// The run ended.
  void finish();
  /// The serving node's gate's refusals (cumulative; read again before each snapshot): added to
  /// `refusals_by_reason` and to the ledger's rows of the parties refused.
  void set_gate_refusals(const gate_refusals& g);
  /// The record id the serving node's gate publishes its refusals under
  /// (`ledger_book::set_own_gate_id`).
  void set_own_gate_id(const std::string& id) { ledger_.set_own_gate_id(id); }
  /// The folder of the run's pictures (`run_description::pictures_dir`).
  void set_pictures_dir(std::string dir) { cur_.run.pictures_dir = std::move(dir); }
  /// One DHT read of ledger records at `now` (the DHT clock, seconds). A builder that got no
  /// metric event (a node other than node 0) also takes the run's samples, loss, loss curve and
  /// step from the summaries (their peers' claims: what that node can read).
  ledger_read_stats add_ledger_records(const std::vector<ledger_entry>& entries, double now);
  /// The ledger as it stands (what `make` puts in the snapshot).
  std::vector<ledger_row> ledger_rows() const { return ledger_.rows(); }
  /// A copy of the current state with the next version number.
  snapshot make();

private:
  member_state* member(const std::string& name);
  /// The planned instance a SWARM stage peer's actor name `s<S>p<P>g<G>` belongs to (instance P
  /// of the role of type `swarm.stage`), its detail set to `stage S`; null for other names.
  member_state* stage_peer(const std::string& source);
  void set_node_live(const std::string& node, bool live);
  void add_samples(const std::string& peer, double n, double t);
  static void bump(std::map<std::string, uint64_t>& m, const std::string& key, size_t cap);
  /// A loss report at run time `t` (the latest loss, and a point of the thinned curve).
  void add_loss(double t, double loss);
  /// Without a metric stream: the run's samples, per-peer samples, mean latest loss and
  /// highest step from the ledger's rows after a read at `now` (DHT clock, Unix seconds).
  void fold_summaries(double now);

  builder_options opts_;
  snapshot cur_;
  /// Instances killed (by a fault or a leave), kept down until a restart or join says otherwise.
  std::map<std::string, bool> down_;
  /// Name -> index into `cur_.members`.
  std::map<std::string, size_t> index_;
  /// (run time, samples_total) marks for the rate; the oldest dropped past the window.
  std::vector<std::pair<double, double>> marks_;
  /// The same per peer of `peer_samples_total` and per stage of `stage_samples_total`.
  std::map<std::string, std::vector<std::pair<double, double>>> peer_marks_, stage_marks_;
  uint64_t next_version_ = 1;
  /// Thinning stride of the loss curve (every `stride_`-th point kept).
  uint64_t curve_stride_ = 1;
  uint64_t curve_seen_ = 0;
  ledger_book ledger_;
  /// The gate's refusals by reason (the largest count seen of each).
  std::map<std::string, uint64_t> gate_reasons_;
};

/// The latest snapshot behind a mutex: the metric stream publishes, handlers read.
class snapshot_store {
public:
  snapshot_store();
  /// Replaces the current snapshot.
  void publish(snapshot s);
  /// The current snapshot (never null; version 0 before the first publish).
  std::shared_ptr<const snapshot> current() const;

private:
  mutable std::mutex mtx_;
  std::shared_ptr<const snapshot> cur_;
};

} // namespace starling::runtime::observe
