// The deterministic simulation driver: one actor system under CAF's testing scheduler, virtual
// time, simulated nodes with their own directories and resolvers, link proxies that carry every
// inter-node message through the network model, a fault injector and an event trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/config/config.hpp"
#include "runtime/sim/network_model.hpp"

#include "actors/auth/deny_list.hpp"
#include "actors/auth/identity.hpp"

namespace starling::actors::auth {
class admission;
} // namespace starling::actors::auth

namespace starling::runtime::sim {

class world;

/// One line of the simulation trace (also written as JSONL).
struct trace_event {
  /// Virtual time in ns since the start.
  int64_t t_ns = 0;
  /// `send`, `drop`, `unserializable`, `kill_node`, `restart_node`, `kill_actor`, `partition`,
  /// `heal`, or a kind recorded by a test or workload through `world::record`.
  std::string kind;
  std::string from;
  std::string to;
  uint64_t bytes = 0;
  /// Arrival time for `send`, reason for `drop`, message types, free text otherwise.
  std::string detail;
};

/// Settings of a simulation.
struct world_options {
  uint64_t seed = 42;
  network_options network;
  /// Timeout of the simulated resolver's lookups.
  caf::timespan resolve_timeout = std::chrono::seconds(5);
  /// Record every message (`send`/`drop`) in the trace; large runs turn it off (faults and
  /// `world::record` calls are still recorded).
  bool trace_messages = true;
  /// Where each trace event goes as it is recorded (JSON lines, the file's old content replaced;
  /// empty: nowhere).
  std::string trace_path;
  /// Whether the events are also kept in memory (`trace()`). A long run streams them to
  /// `trace_path` instead: 64 dedloc peers record ~43,000 events per simulated second, several
  /// hundred bytes each; the digest and the count are kept either way.
  bool keep_trace = true;
  /// Extra settings of the actor system (message types of user roles).
  std::function<void(caf::actor_system_config&)> configure;
  /// Each node's gate, as on live nodes (runtime/node/gate.hpp): two nodes admit each other by
  /// the signed hello when one first resolves an actor of the other, and every message between
  /// nodes is checked on arrival (a sender never admitted, or revoked, is refused and a request
  /// answered with the refusal). Keys, challenges and clock are seeded and virtual. Default on.
  bool gate = true;
  /// A closed run (needs `gate`): an authority derived from the seed issues each node a token
  /// (every role, valid for `token_lifetime` of virtual time from each start of the node), the
  /// gates admit token holders only, and `world::ban` refuses a node at every gate from then on,
  /// deterministically (what BTARD's bans and tests of them build on).
  bool closed = false;
  std::chrono::nanoseconds token_lifetime = std::chrono::hours(24);
};

/// A simulated node: a name, an index in the network model, an identity, and the actors
/// spawned on it. Killing the node kills them all; restarting runs its start hooks again.
class sim_node {
public:
  /// The node's name (also its host in peer addresses: `name:1/actor`).
  const std::string& name() const { return name_; }
  /// Index in the network model.
  int index() const { return index_; }
  /// `name:1`, the endpoint used in peer addresses.
  std::string endpoint() const;
  /// A stable per-node identity (hex), derived from the world seed and the index.
  const std::string& identity() const { return identity_; }
  /// False between a kill and a restart.
  bool alive() const { return alive_; }
  /// The node's resolver: `(resolve_atom, "host:port/name") -> actor` (a link proxy when the
  /// target lives on another node).
  caf::actor resolver() const { return resolver_; }

  /// Spawns an actor on this node and registers it under `name` (empty = unnamed).
  template <class F, class... Ts>
  caf::actor spawn(const std::string& name, F fun, Ts&&... xs);

  /// Records an actor spawned elsewhere as living on this node.
  void adopt(const std::string& name, const caf::actor& a);

  /// Registers a hook that (re)creates the node's actors; runs now if the node is alive and
  /// again after every restart.
  void on_start(std::function<void(sim_node&)> hook);

  /// The actor registered under `name`, or an invalid handle.
  caf::actor lookup(const std::string& name) const;

private:
  friend class world;
  sim_node(world* w, std::string name, int index, std::string identity);

  world* world_;
  std::string name_;
  int index_;
  std::string identity_;
  bool alive_ = true;
  caf::actor resolver_;
  std::map<std::string, caf::actor> named_;
  std::vector<caf::actor> actors_;
  std::vector<std::function<void(sim_node&)>> hooks_;
};

/// The simulation. Tests create one per case; it kills every actor it knows on destruction.
class world {
public:
  explicit world(world_options opts);
  ~world();
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  caf::actor_system& system() { return *sys_; }

  // -- nodes --------------------------------------------------------------------------------

  /// Adds a node named `name` (unique).
  sim_node& add_node(const std::string& name);
  /// The node named `name`; throws std::out_of_range if there is none.
  sim_node& node(const std::string& name);
  /// The node at `index`.
  sim_node& node(int index);
  size_t num_nodes() const { return nodes_.size(); }
  /// The node an actor was spawned on, or -1.
  int node_of(const caf::actor_addr& a) const;

  // -- time ---------------------------------------------------------------------------------

  /// Virtual time since the start.
  std::chrono::nanoseconds elapsed() const;
  /// Runs every runnable job without advancing time.
  void run();
  /// Advances virtual time by `d`, delivering messages, timeouts and faults in order.
  void run_for(std::chrono::nanoseconds d);
  /// Runs until `pred()` holds (checked after each step) or `limit` of virtual time passes.
  /// Returns whether `pred()` held.
  bool run_until(const std::function<bool()>& pred, std::chrono::nanoseconds limit);

  // -- faults -------------------------------------------------------------------------------

  /// Kills every actor of the node now; restarts it after `restart_after` (negative = never).
  void kill_node(const std::string& name, std::chrono::nanoseconds restart_after);
  /// Restarts a dead node: fresh resolver, start hooks run again.
  void restart_node(const std::string& name);
  /// Kills one named actor of a node.
  void kill_actor(const std::string& node, const std::string& actor);
  void partition(const std::string& a, const std::string& b);
  void heal(const std::string& a, const std::string& b);
  /// Queues one action at virtual time `at` (since start).
  void at(std::chrono::nanoseconds at, std::string what, std::function<void()> action);

  // -- observation --------------------------------------------------------------------------

  network_model& network() { return net_; }
  /// The world's seeded generator (for tests and workloads that need randomness).
  std::mt19937_64& rng() { return rng_; }
  /// The events kept in memory (all of them unless `keep_trace` is off or `clear_trace` ran).
  const std::vector<trace_event>& trace() const { return trace_; }
  /// Drops the events kept so far and frees their memory (long runs that only need the end);
  /// the digest and the count still cover them.
  void clear_trace() { std::vector<trace_event>().swap(trace_); }
  /// Events recorded since the start.
  uint64_t trace_events() const { return events_; }
  /// Why `trace_path` could not be written (empty: it was, or none was asked for).
  const std::string& trace_error() const { return trace_error_; }
  /// Whether messages are traced (world_options::trace_messages).
  bool trace_messages() const { return opts_.trace_messages; }
  /// Appends an event at the current virtual time.
  void record(std::string kind, std::string from, std::string to, uint64_t bytes,
              std::string detail);
  /// Calls `f` with every event recorded from now on (after it entered the digest); one
  /// observer, which must not act on the world: a watched run's page reads refusals here.
  void on_record(std::function<void(const trace_event&)> f);
  /// Writes the events kept in memory as JSON lines.
  void write_trace_jsonl(const std::string& path) const;
  /// A hash of every event recorded since the start, to compare runs cheaply.
  uint64_t trace_digest() const;
  /// Link proxies spawned so far (each a handle of one node's actor as seen from another).
  uint64_t proxies_made() const { return proxies_made_; }
  /// True for a node of `network.firewalled` (it accepts no connection).
  bool firewalled(int index) const { return firewalled_.count(index) > 0; }
  /// Messages to a firewalled node from a node it had not sent to first: dropped (a request
  /// among them is answered with an error, as a connection refused) and recorded in the trace as
  /// `unsolicited`.
  uint64_t unsolicited() const { return unsolicited_; }
  /// A message from `from` to `to`: true when it may pass the firewall of `to` (none, or `to`
  /// sent to `from` before); notes `from`'s outbound path when `from` is firewalled.
  bool passes_firewall(int from, int to);

  // -- used by link proxies and resolvers ---------------------------------------------------

  /// A proxy for `target` as seen from node `from` (cached while the target lives). As a live
  /// node that resolves an actor first, the two nodes say hello (when gates are on) unless
  /// `greet` is false: a handle that merely travelled in a message (reply proxies, or a test of
  /// a node that skipped the hello).
  caf::actor proxy(int from, const caf::actor& target, bool greet = true);
  /// As `proxy`, but when messages are not traced the hello waits for the first message between
  /// the two nodes (either way; `greet_if_due`): what a node that reads a peer list needs. A
  /// 10,000-peer run lists 1250 peers per gossip exchange and would otherwise sign and verify
  /// 12.5 million hellos for pairs that never exchange a message. Admissions are the same at
  /// every message (a gate is only asked when a message arrives, and a restart clears a due
  /// hello as it clears a said one); traced runs say it now, so their hello lines stay put.
  caf::actor lazy_proxy(int from, const caf::actor& target);
  /// Says the hello between nodes `from` and `to` if a `lazy_proxy` left it due.
  void greet_if_due(int from, int to);
  /// Serialized size of a message, or an error text if it does not serialize.
  bool serialized_size(const caf::message& msg, uint64_t& bytes, std::string& error);
  /// Looks up `host:port/name` as seen from node `from`; errors say why.
  caf::expected<caf::actor> resolve(int from, const std::string& address);
  /// The type names of a message's elements, for the trace.
  std::string type_names(const caf::message& msg) const;
  /// Node `index`'s gate (null when `world_options::gate` is off).
  actors::auth::admission* gate(int index);
  /// Empty when node `to` admits messages from node `from`, else the refusal's line.
  std::string admits(int to, int from);
  /// A closed run's authority bans node `name` (its node key) for `reason`: it signs a deny list
  /// with the next serial, every gate installs it (gates that restart later too), and every
  /// message from that node is refused from then on, with the reason; its own gate refuses the
  /// others' as well. Empty on success, else why not (an open run, an unknown node).
  std::string ban(const std::string& name, const std::string& reason);
  /// The serial of the deny list in force (0: none signed yet).
  uint64_t deny_serial() const { return deny_.serial; }

private:
  friend class sim_node;
  void track(int node, const caf::actor& a);
  void start_node(sim_node& n);
  /// The hello between nodes `from` and `to` (once per pair and incarnation): empty when both
  /// admitted each other, else the refusal's line.
  std::string say_hello(int from, int to);
  /// A fresh gate for node `index` (at its start and each restart: sessions die with a process).
  void reset_gate(int index);
  void apply_due_faults();
  int64_t now_ns() const;
  caf::scheduler::test_coordinator& sched();

  world_options opts_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  network_model net_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<sim_node>> nodes_;
  /// Node index by name and by endpoint (`name:1`), so lookups do not scan every node.
  std::unordered_map<std::string, int> by_name_;
  std::unordered_map<std::string, int> by_endpoint_;
  /// Hot lookups (every simulated message): hashed, not ordered.
  struct proxy_key_hash {
    size_t operator()(const std::pair<int, caf::actor_id>& k) const noexcept {
      return std::hash<uint64_t>{}(k.second * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(k.first));
    }
  };
  /// Node of each tracked actor, indexed by actor id (CAF numbers actors 1, 2, ...; -1: none).
  std::vector<int> actor_node_;
  std::unordered_map<std::pair<int, caf::actor_id>, caf::actor, proxy_key_hash> proxies_;
  uint64_t proxies_made_ = 0;
  /// Firewalled nodes, and the (firewalled node, peer) pairs it opened by sending first.
  std::set<int> firewalled_;
  std::set<std::pair<int, int>> opened_;
  uint64_t unsolicited_ = 0;
  std::multimap<int64_t, std::pair<std::string, std::function<void()>>> pending_;
  std::vector<trace_event> trace_;
  /// FNV-1a over every field of every event (`trace_digest`), and their count.
  uint64_t digest_ = 1469598103934665603ULL;
  std::function<void(const trace_event&)> observer_;
  uint64_t events_ = 0;
  std::unique_ptr<std::ofstream> trace_out_;
  std::string trace_error_;
  caf::actor_clock::time_point start_;
  /// Per node: its gate, and the nodes it said hello with in this incarnation.
  std::vector<std::unique_ptr<actors::auth::admission>> gates_;
  /// Pairs of nodes that said hello: `greeted_[from][to]`, set in both orders (rows grow on
  /// demand), so that a restart clears one row and one column instead of scanning every pair.
  std::vector<std::vector<bool>> greeted_;
  /// Hellos left due by `lazy_proxy`: `greet_due_[from][to]` (rows grow on demand).
  std::vector<std::vector<bool>> greet_due_;
  /// Challenges of the gates: seeded apart from `rng_`, so turning gates on or off does not
  /// change the rest of a run's randomness.
  std::mt19937_64 gate_rng_;
  /// Closed runs: the authority's key, its deny list and that list signed (empty until a ban).
  std::unique_ptr<actors::auth::key_pair> authority_;
  actors::auth::deny_list deny_;
  std::string deny_signed_;
  /// The key of node `index` (the same in every incarnation).
  actors::auth::key_pair node_key(size_t index) const;
  /// The experiment id of a closed run's tokens.
  std::string experiment() const;
};

template <class F, class... Ts>
caf::actor sim_node::spawn(const std::string& name, F fun, Ts&&... xs) {
  auto a = world_->system().spawn(fun, std::forward<Ts>(xs)...);
  adopt(name, a);
  return a;
}

} // namespace starling::runtime::sim
