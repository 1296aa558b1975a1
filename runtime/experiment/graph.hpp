// The experiment graph: which roles run, how many of each, with which options, how they restart,
// where they are placed, when instances arrive and leave, and what goes wrong when. Two front
// doors build it — the C++ builder below and the YAML sections `roles:`, `placement:`, `faults:`
// and `events:` (runtime/experiment/yaml.hpp) — and one validator checks it. The same graph runs
// in simulation, local and cluster mode: `make_plan` (plan.hpp) turns it into role instances on
// nodes and a fault plan with times.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/config/config.hpp"

namespace starling::runtime {

class reporter;
class role_registry;

/// How a run executes: simulated nodes in virtual time, one process in real time, or one
/// `starling node` process per node.
enum class run_mode { sim, local, cluster };

/// `sim`, `local` or `cluster`.
const char* to_string(run_mode m);

/// What happens when a role instance dies.
struct restart_policy {
  /// Respawn an instance that died for any reason (a crash, a kill fault without its own
  /// `restart_after`). Explicit fault restarts happen whatever this says.
  bool supervised = true;
  /// Delay before a respawn.
  std::chrono::nanoseconds delay = std::chrono::seconds(5);
  /// A respawned instance (generation > 0) fetches its state from live peers before serving;
  /// what that means is the role's business (a stage peer downloads parameters).
  bool download_state = true;
};

/// Where a role's instances run.
struct placement_spec {
  /// Nodes the instances may run on (empty: any). Instance i of a pinned role goes to
  /// `nodes[i mod size]`; with `spread`, the least loaded of these.
  std::vector<size_t> nodes;
  /// Spread the instances over the eligible nodes, fewest instances of this role first, then
  /// fewest instances in all (the default). Off: `nodes` is a pin list, used round robin.
  bool spread = true;
  /// Instance i runs on the node of instance (i mod count) of this role (empty: none).
  std::string colocate;
  /// Prefer nodes that host none of these roles (a preference: ignored when every eligible
  /// node hosts one).
  std::vector<std::string> avoid;
  /// Volunteer slots: the plan assigns the instances to no node; `starling node` processes
  /// started without `--index` claim them (cluster mode). In sim and local mode they run on
  /// extra nodes after the numbered ones.
  bool open = false;
};

/// One role of the graph: a registered role type, replicated.
struct role_spec {
  /// Name of the role in this graph (`trainer`, `peers`); instance i is `<name>.<i>`.
  std::string name;
  /// Registered role type (`swarm.stage`, `ping.pinger`).
  std::string type;
  /// Instances at the start.
  size_t replicas = 1;
  /// The role type's options struct (as its registry entry reads and checks it).
  std::any options;
  restart_policy restart;
  placement_spec placement;
};

/// Every kind of fault the runner injects.
enum class fault_kind {
  /// Kill one role instance (given, or drawn by the plan) at a time; restarted after a delay.
  kill,
  /// Kill a whole node and everything on it; restarted after a delay.
  kill_node,
  /// Poisson preemptions of a role: each kills a drawn instance, restarted after a delay.
  preempt,
  /// Cut the links between groups of nodes until `until` (or the end).
  partition,
  /// Slow the link between two nodes (simulation only) until `until` (or the end).
  slow_link,
  /// The run's authority bans a node's peer (simulation only: its world is then a closed run):
  /// every gate refuses that node from then on, restarts included.
  ban,
};

/// `kill`, `kill_node`, `preempt`, `partition`, `slow_link` or `ban`.
const char* to_string(fault_kind k);

/// Restart delays: a duration, the default of the role (or node), or never.
struct restart_after {
  /// Unset: the role's restart policy delay (node faults: 5 s).
  std::optional<std::chrono::nanoseconds> delay;
  bool never = false;
};

/// One fault of the graph, before the plan gives it times and victims.
struct fault_spec {
  fault_kind kind = fault_kind::kill;
  /// Time since the start (`kill`, `kill_node`, `partition`, `slow_link`), or the start of the
  /// preemption process (`preempt`).
  std::chrono::nanoseconds at{0};
  /// End of a partition, slow link or preemption process (unset: the end of the run).
  std::optional<std::chrono::nanoseconds> until;
  /// `kill`, `preempt`: the role.
  std::string role;
  /// `kill`: the instance (unset: drawn by the plan from the role's instances).
  std::optional<size_t> instance;
  /// `kill_node`, `ban`: the node; `slow_link`: one end.
  size_t node = 0;
  /// `slow_link`: the other end.
  size_t peer = 0;
  /// `preempt`: mean time between preemptions of the whole role.
  std::chrono::nanoseconds every{0};
  restart_after restart;
  /// `partition`: groups of nodes; links between nodes of different groups are cut.
  std::vector<std::vector<size_t>> groups;
  /// `slow_link`: the link's one-way latency and bandwidth (bytes/s) while it lasts.
  std::chrono::nanoseconds latency{0};
  double bandwidth = 0;
  /// `ban`: the reason the refused node is told.
  std::string reason;
  /// The YAML line (0 from the builder), for errors found later.
  int line = 0;
};

/// A role instance arriving (a new replica) or departing (on purpose) during the run.
struct event_spec {
  enum class kind { join, leave } what = kind::join;
  std::chrono::nanoseconds at{0};
  std::string role;
  /// `join`: how many new instances arrive; `leave`: which instance departs.
  size_t count = 1;
  size_t instance = 0;
};

/// Churn of a role: its instances leave on purpose at random times, each replaced by a newcomer
/// (a new instance). The plan draws the leaves with its Poisson generator (plan.hpp): on average
/// `per_minute` of the live instances leave per minute, the victim drawn among them.
struct churn_spec {
  std::string role;
  /// Leaves per live instance and minute (0: none).
  double per_minute = 0;
  /// A newcomer arrives this long after each leave (none past the run's end).
  std::chrono::nanoseconds rejoin_after = std::chrono::seconds(5);
  /// At least this many instances stay.
  size_t keep = 2;
  /// When set, at least one live instance `i` with `serves(i)` stays (one that can hand the
  /// state to newcomers, say).
  std::function<bool(size_t)> serves;
};

/// Makes the reporter of a run (a kind's summary, tables and plots).
using reporter_factory = std::function<std::unique_ptr<reporter>()>;

struct experiment_graph;
struct run_result;

/// Runs one graph (a study's variant) with the caller's mode and settings.
using run_function = std::function<run_result(const experiment_graph&)>;

/// A whole experiment.
struct experiment_graph {
  /// Name for logs, DHT keys and the output folder.
  std::string name = "experiment";
  /// The kind shorthand it came from (`swarm`, `ping`, ...), empty for a plain graph.
  std::string kind;
  uint64_t seed = 42;
  /// How long the run lasts at most (virtual time in simulation); a reporter may end it sooner.
  std::chrono::nanoseconds duration = std::chrono::seconds(60);
  /// Nodes of the run; 0 = one node per instance (cluster mode takes `--nodes`).
  size_t nodes = 0;
  std::vector<role_spec> roles;
  std::vector<fault_spec> faults;
  std::vector<event_spec> events;
  /// Planned churn, drawn by the plan into leaves and joins (at most one per role, whose
  /// instances come and go by no event of `events`).
  std::vector<churn_spec> churn;
  /// Simulation: record every message between nodes in the trace (faults, restarts and
  /// metrics always are); large simulations turn it off.
  bool trace_messages = true;
  /// Why `starling run --resume` cannot continue a stopped run of this graph; empty when its
  /// kind keeps its learned state and progress in the run folder (checkpoints, progress files).
  std::string not_resumable = "its kind keeps no learned state in the run folder";
  /// Set with an empty `not_resumable`: checks what a stopped run left in its folder (every file
  /// a resumed run will read) and says in a few lines what the run will continue from; fails,
  /// naming the file, on anything unreadable.
  std::function<result<std::string>(const std::string& run_dir)> inspect_resume;
  /// CAF, node and (simulation) network settings of the file.
  caf_options caf;
  node_options node;
  network_options network;
  /// The run's reporters, in order; each sees every metric.
  std::vector<reporter_factory> reporters;
  /// A study (set by a kind): instead of one run, runs variants of this graph through `run`
  /// and prints their comparison (tables, and plots into `out_dir`); returns the exit code.
  /// Unset: one run.
  std::function<int(const experiment_graph& self, const run_function& run,
                    const std::string& out_dir)>
    study;

  /// The role named `name`, or null.
  const role_spec* find(const std::string& name) const;
  /// Total instances at the start (replicas summed).
  size_t instance_count() const;
};

/// Checks the graph against the registry: known, unique role names and types, options of the
/// right type that the type's check accepts, placements naming existing roles and nodes, faults
/// and events naming existing roles and instances, times within the duration; and that `mode`
/// supports every fault kind. The failure names the role or fault.
status validate(const experiment_graph& g, const role_registry& registry, run_mode mode);

/// Whether a mode carries out a fault kind (a slow link exists only in the network model; a
/// partition needs separate nodes with links of their own).
bool supports(run_mode mode, fault_kind kind);

/// The C++ front door. Example:
///
///     experiment_builder b{"gossip"};
///     b.seed(7).duration(std::chrono::seconds(30)).nodes(4);
///     b.role("peer", "gossip.peer", gossip_options{}).replicas(8).restart_delay(2s);
///     b.preempt("peer", std::chrono::seconds(5));
///     auto g = b.build(registry, run_mode::sim);
class experiment_builder {
public:
  /// Settings of one role, changed in place.
  class role_ref {
  public:
    role_ref& replicas(size_t n);
    role_ref& restart_delay(std::chrono::nanoseconds d);
    /// Dead instances are not respawned (explicit fault restarts still happen).
    role_ref& unsupervised();
    role_ref& download_state(bool on);
    /// Runs on these nodes, instance i on `nodes[i mod size]`.
    role_ref& pin(std::vector<size_t> nodes);
    /// Spreads over these nodes (empty: all).
    role_ref& spread(std::vector<size_t> nodes = {});
    role_ref& colocate(std::string role);
    role_ref& avoid(std::vector<std::string> roles);
    role_ref& open();

  private:
    friend class experiment_builder;
    role_ref(experiment_graph* g, size_t i) : g_(g), i_(i) {}
    role_spec& spec() { return g_->roles[i_]; }
    experiment_graph* g_;
    size_t i_;
  };

  explicit experiment_builder(std::string name);
  experiment_builder& seed(uint64_t s);
  experiment_builder& duration(std::chrono::nanoseconds d);
  experiment_builder& nodes(size_t n);
  experiment_builder& network(const network_options& n);
  /// Adds a role of a registered type with its options struct.
  template <class Options>
  role_ref role(std::string name, std::string type, Options options) {
    role_spec r;
    r.name = std::move(name);
    r.type = std::move(type);
    r.options = std::move(options);
    g_.roles.push_back(std::move(r));
    return role_ref{&g_, g_.roles.size() - 1};
  }
  /// Settings of a role added before.
  role_ref role(const std::string& name);
  /// Kills instance `instance` of `role` (unset: drawn) at `at`.
  experiment_builder& kill(std::string role, std::optional<size_t> instance,
                           std::chrono::nanoseconds at, restart_after r = {});
  experiment_builder& kill_node(size_t node, std::chrono::nanoseconds at, restart_after r = {});
  /// Poisson preemptions of `role`, one every `every` on average.
  experiment_builder& preempt(std::string role, std::chrono::nanoseconds every,
                              restart_after r = {});
  experiment_builder& partition(std::vector<std::vector<size_t>> groups,
                                std::chrono::nanoseconds at,
                                std::optional<std::chrono::nanoseconds> until = {});
  experiment_builder& slow_link(size_t a, size_t b, std::chrono::nanoseconds latency,
                                double bandwidth, std::chrono::nanoseconds at,
                                std::optional<std::chrono::nanoseconds> until = {});
  /// The run's authority bans node `node` at `at` (simulation only).
  experiment_builder& ban(size_t node, std::chrono::nanoseconds at, std::string reason);
  experiment_builder& fault(fault_spec f);
  /// `count` new instances of `role` arrive at `at`.
  experiment_builder& join(std::string role, std::chrono::nanoseconds at, size_t count = 1);
  /// Instance `instance` of `role` leaves on purpose at `at`.
  experiment_builder& leave(std::string role, size_t instance, std::chrono::nanoseconds at);
  /// Adds churn to a role (`churn_spec`).
  experiment_builder& churn(churn_spec c);
  experiment_builder& reporter(reporter_factory f);
  /// The graph as built so far (not validated).
  experiment_graph& graph() { return g_; }
  /// The graph, validated for `mode`.
  result<experiment_graph> build(const role_registry& registry, run_mode mode) const;

private:
  experiment_graph g_;
};

} // namespace starling::runtime
