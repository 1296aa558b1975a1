// What every node of a run runs, whatever the mode: the metrics sink, the supervisor with the
// node's role instances, and the fault injector carrying out the node's share of the fault plan
// on CAF's clock. The three runners (sim_runner.cpp, local_runner.cpp, cluster_runner.cpp)
// provide the hosts; this file is the part they share.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/fwd.hpp>

#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

class jsonl_writer;

/// The run's reporters behind one lock: metrics come from actor threads (local mode), ticks
/// and the end from the runner's thread.
class metric_hub {
public:
  /// Writes every metric to `jsonl_path` (empty: nowhere) and hands it to `reporters`.
  metric_hub(std::vector<std::unique_ptr<reporter>> reporters, const std::string& jsonl_path);
  ~metric_hub();
  void start(const run_info& info);
  void deliver(const metric_record& m);
  /// True when a reporter says the run's work is complete.
  bool tick(double t);
  /// The first non-zero exit code of the reporters' `finish`, or 0. Metrics that come later
  /// still reach the reporters' `on_late_metric`.
  int finish(finish_context& ctx);
  /// Once the run's actors stopped (no metric comes any more): the reporters' `close` (once).
  void close();
  /// Also called for every metric (simulation: records it in the trace).
  void on_deliver(std::function<void(const metric_record&)> f) { observer_ = std::move(f); }

private:
  std::mutex mtx_;
  /// Set when `finish` begins: later metrics reach the file, no longer the reporters.
  bool finishing_ = false;
  bool closed_ = false;
  std::vector<std::unique_ptr<reporter>> reporters_;
  std::unique_ptr<jsonl_writer> out_;
  std::function<void(const metric_record&)> observer_;
};

/// A host that runners also use to carry out node-level faults.
class node_host : public host {
public:
  /// The node's metrics sink once started (`metrics()` returns it).
  caf::actor sink;
  /// This node's folder in the run's output, set by the runner (`run_dir()` returns it).
  std::string dir;

  std::string run_dir() const override { return dir; }
};

/// The part of a host that local and cluster nodes share: a directory of named actors, the
/// actors the node owns (stopped with it) and its services, behind one lock (roles call the host
/// from actor threads).
class threaded_host : public node_host {
public:
  explicit threaded_host(caf::actor directory) : directory_(std::move(directory)) {}

  void register_actor(const std::string& name, const caf::actor& a) override;
  void adopt(const caf::actor& a) override;
  caf::actor service(const std::string& name,
                     const std::function<caf::actor(host&)>& make) override;

  /// Stops every actor the node owns (`reason`: kill for a fault, user_shutdown at the end) and
  /// forgets its services.
  void stop_all(caf::exit_reason reason);

protected:
  /// Registers and adopts.
  void put(const std::string& name, const caf::actor& a);

  caf::actor directory_;
  std::mutex mtx_;

private:
  std::vector<caf::actor> owned_;
  std::map<std::string, caf::actor> services_;
};

/// Runs `body` in a fresh event-based actor of `sys` and blocks until the actor quits or
/// `timeout` passes (the real-time finish contexts' `run`).
void run_and_wait(caf::actor_system& sys, const std::function<void(caf::event_based_actor*)>& body,
                  std::chrono::nanoseconds timeout);

/// What `start_node_share` started on a node.
struct node_share {
  caf::actor supervisor;
  caf::actor injector;
  /// Plan instance index -> the supervisor's child index.
  std::vector<std::pair<size_t, size_t>> children;
};

/// Spawns the node's metrics sink: it stamps each `messages::metric_event` with the run time
/// and hands it to `deliver` (sim and local mode, and node 0 of a cluster) or forwards it to
/// `forward_to` (the other cluster nodes; resolved through the host's resolver). `observe`, when
/// set, also sees each of this node's events first (on the sink's thread): a volunteer counts
/// its own work from it.
caf::actor spawn_metric_sink(node_host& h, std::function<void(const metric_record&)> deliver,
                             std::string forward_to,
                             std::function<void(const metric_record&)> observe = {});

/// Starts the node's role instances under a supervisor and its fault injector for `faults`
/// (indices into the plan's faults: the instance kills and whatever else the caller lets the
/// injector do through `node_fault`). `incarnation` > 0 after a node restart: instances
/// start at a later generation (they download their state).
node_share start_node_share(node_host& h, const role_registry& registry, int incarnation,
                            std::vector<size_t> faults,
                            std::function<void(const planned_fault&)> node_fault = {});

struct run_result;
struct run_settings;

/// The simulation runner (sim_runner.cpp) and the local one (local_runner.cpp).
run_result run_sim(const experiment_graph& g, const role_registry& registry, const plan& p,
                   const run_settings& s);
run_result run_local(const experiment_graph& g, const role_registry& registry, const plan& p,
                     const run_settings& s);

/// The DHT bootstrap list of a node in an in-process run: a few of the nodes that started their
/// DHT before (`started`, in start order), as `@<node>/dht` addresses.
std::vector<std::string> bootstrap_from(const std::vector<size_t>& started, size_t self);

/// The reporters of a graph, made fresh for a run (a plain graph gets the counting reporter).
std::vector<std::unique_ptr<reporter>> make_reporters(const experiment_graph& g);

/// Seconds since the run started, on the caller's clock.
inline double seconds_of(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

} // namespace starling::runtime
