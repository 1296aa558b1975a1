// Watching a run while it runs (`node.http` / `--http`): the HTTP endpoint of runtime/observe,
// the reporter that feeds its snapshots from the run's metric stream on the reporting node, and
// the reader of the peers' ledger summaries in the DHT (any serving node: the page shows the
// whole run while node 0 is down). `<run>/ledger.csv` is written at the end of every run.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "kernels/result.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/reporter.hpp"

namespace starling::runtime {

class node_gate;

namespace observe {
class http_server;
class snapshot_store;
struct ledger_entry;
} // namespace observe

/// What a ledger reader does with one complete read of the 64 shards: the records (signatures
/// verified), the DHT clock's now in seconds, and how many records were left unread or refused.
using ledger_fold = std::function<void(const std::vector<observe::ledger_entry>&, double, size_t)>;

/// Spawns (in `sys`) an actor that reads the 64 ledger shards of `experiment` through `dht`
/// every `every` and hands each read to `fold` (on the actor's thread); the caller owns it.
caf::actor spawn_ledger_reader(caf::actor_system& sys, const caf::actor& dht,
                               const std::string& experiment, std::chrono::nanoseconds every,
                               ledger_fold fold);

/// Spawns (in `sys`) an actor that stores what `gate` refused (`actors::collab::gate_summary`:
/// counts by reason, and by party whose key it knew) under `<experiment>/ledger/gates` every
/// `every`, signed by the node's key through `dht` (sub-key `gate|<owner marker>`), expiring
/// after four periods; it stores nothing while the gate refused nobody. Every node's ledger
/// reader reads it: a party refused by one node shows on every node's page and ledger. The
/// caller owns it (a host adopts it); null when `every` is not positive.
caf::actor spawn_gate_publisher(caf::actor_system& sys, const caf::actor& dht,
                                const std::string& experiment, std::shared_ptr<node_gate> gate,
                                std::chrono::nanoseconds every);

/// The record id a node with public key `node_key` stores its gate record under.
std::string gate_record_id(const std::string& node_key);

/// The endpoint of one run and the state its reporter shares with it.
class run_watch {
public:
  /// Binds `endpoint` (`HOST:PORT`; port 0: a free one) and serves the run of `g` under `p`.
  static result<std::unique_ptr<run_watch>>
  start(const std::string& endpoint, const experiment_graph& g, const plan& p, run_mode mode);
  ~run_watch();

  /// A reporter that folds every metric into the served snapshot (one per run; put it first,
  /// so that the page says the run finished while the other reporters summarize).
  std::unique_ptr<reporter> make_reporter();
  /// `http://HOST:PORT/`.
  std::string url() const;

  /// Folds an event the watch alone sees into the served snapshot (not into `metrics.jsonl`):
  /// a simulated run's refusals, which its world records outside the metric stream.
  void note(const metric_record& m);

  /// Shows what the node's `gate` refuses: its refusals by reason join the served
  /// `refusals_by_reason`, and each party whose key it knew gets its refusals and ban reason on
  /// its ledger rows (read again before every published snapshot). `record_id` is the id the
  /// node's gate publisher stores its record under (`spawn_gate_publisher`): read back from the
  /// DHT it is this gate, not another one.
  void watch_gate(std::shared_ptr<node_gate> gate, const std::string& record_id = {});

  /// Spawns (in `sys`) the actor that reads the run's 64 ledger shards through the node's
  /// `dht` every `every` and folds them into the served snapshot; the caller owns it (a host
  /// adopts it). Each reply decodes at most `actors::collab::max_ledger_reply_records` records.
  caf::actor read_ledger(caf::actor_system& sys, const caf::actor& dht,
                         std::chrono::nanoseconds every);

  struct state;

private:
  run_watch() = default;
  std::shared_ptr<state> state_;
  std::unique_ptr<observe::http_server> server_;
};

/// Serves the run when `g.node.http` asks for it: starts the endpoint, puts its reporter first
/// in `reporters` and prints `prefix` + "watch the run at URL". Null when the run is not
/// served; an error (say it and fail the run: nothing has started) when the endpoint cannot be.
result<std::unique_ptr<run_watch>> watch_if_asked(const experiment_graph& g, const plan& p,
                                                  run_mode mode,
                                                  std::vector<std::unique_ptr<reporter>>& reporters,
                                                  const std::string& prefix = "");

/// A reporter that folds the run's metric stream into the contribution ledger and writes
/// `<run>/ledger.csv` at the end (when any peer appeared). A watched run's reporter writes it
/// instead, with the DHT's records folded in too.
std::unique_ptr<reporter> make_ledger_reporter();

} // namespace starling::runtime
