// Roles: a role type is a name, an options struct (read from YAML and checked in one place, with
// documented defaults) and a spawn function that receives a host — what a role instance may use
// on its node: the actor system, the resolver, the node's DHT, averagers, registration under a
// name, the metrics sink, its instance index and a seeded generator. The DHT, averager,
// resolver, metrics sink and supervisor are host services, not placed roles.
//
// A role registry holds the role types a run may use and the kind shorthands (`swarm:`, `ping:`,
// ...) that expand into graphs. Registering a role type is a call of our own
// (`role_registry::add`), not CAF's `add_actor_type`: nothing here lets a remote node spawn
// actors through CAF's spawn server.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/fwd.hpp>

#include "kernels/result.hpp"
#include "runtime/config/reader.hpp"
#include "runtime/experiment/graph.hpp"

namespace starling::actors::averager {
struct averager_options;
} // namespace starling::actors::averager

namespace starling::actors::supervisor {
struct rebalancing_options;
} // namespace starling::actors::supervisor

namespace starling::actors::auth {
class key_pair;
} // namespace starling::actors::auth

namespace starling::runtime {

struct plan;

/// What a role instance may use on its node. One host per node; it lives as long as the node.
class host {
public:
  virtual ~host();

  /// The actor system the node's actors live in (shared by all nodes in sim and local mode).
  virtual caf::actor_system& system() = 0;
  virtual run_mode mode() const = 0;
  /// This node's index in the plan and its name (`node3`).
  virtual size_t index() const = 0;
  virtual const std::string& name() const = 0;
  /// `host:port` under which the node's actors are addressed (`node3:1` in simulation).
  virtual std::string endpoint() const = 0;
  /// `(resolve_atom, address) -> actor`: `host:port/name`, or `@<node>/<name>` for an actor of
  /// node `<node>` of this run (a link proxy in simulation, a remote handle in a cluster).
  virtual caf::actor resolver() = 0;
  /// The node's DHT actor (started on first use, bootstrapped from the run's other nodes).
  virtual caf::actor dht() = 0;
  /// The node's metrics sink: send it `messages::metric_event`s.
  virtual caf::actor metrics() = 0;
  /// Registers `a` under `name` on this node (resolvable as `@<index>/<name>`); the entry goes
  /// when the actor dies.
  virtual void register_actor(const std::string& name, const caf::actor& a) = 0;
  /// Tells the host that `a` lives on this node (killed with the node, stopped at the end).
  virtual void adopt(const caf::actor& a) = 0;
  /// A node-wide service created once per node life by `make` and kept under `name` (a board,
  /// a data cache); dies with the node.
  virtual caf::actor service(const std::string& name,
                             const std::function<caf::actor(host&)>& make) = 0;
  /// An averager for one role instance, addressed as `<endpoint>/<name>` and registered; its
  /// data plane uses direct links between nodes in cluster mode.
  virtual caf::actor spawn_averager(const std::string& name,
                                    actors::averager::averager_options opts) = 0;
  /// In simulation, `a` as seen from this node (a link proxy when `a` lives on another node);
  /// `a` itself otherwise.
  virtual caf::actor view(const caf::actor& a) = 0;
  /// A service shared by every node of the process (sim and local mode only; an invalid handle
  /// in cluster mode), created once by `make`. Simulation uses it for idealized services whose
  /// traffic is not modeled.
  virtual caf::actor shared_service(const std::string& name,
                                    const std::function<caf::actor()>& make) = 0;
  /// The run's graph and plan.
  virtual const experiment_graph& graph() const = 0;
  virtual const struct plan& plan() const = 0;
  /// Time since the run started on CAF's clock (virtual in simulation).
  virtual std::chrono::nanoseconds elapsed() = 0;
  /// This node's folder in the run's output (`<out>/<node name>`: checkpoints of its stage
  /// peers); empty when the run writes no output (the node then keeps nothing on disk).
  virtual std::string run_dir() const = 0;
  /// The node's own key pair (its gate's and DHT's identity) in cluster mode; null in sim and
  /// local mode. A role that signs with it speaks for the node (BTARD with one peer per node).
  virtual const actors::auth::key_pair* node_key() const { return nullptr; }
  /// The node's directory (`(get_atom, name) -> actor` for its own named actors, e.g. `gate`:
  /// actors/auth/ban_service.hpp) in cluster mode; invalid elsewhere.
  virtual caf::actor node_directory() { return {}; }
  /// In a closed run, the id of this node's token in hex (public: the ledger's token id
  /// column); empty otherwise.
  virtual std::string token_id() const { return {}; }
  /// False when other nodes cannot open connections to this node (cluster: a node in client
  /// mode, `node.client`; simulation: a node of `network.firewalled`): roles that have a client
  /// mode run in it (a data-parallel peer reduces nothing and serves no state).
  virtual bool reachable() const { return true; }
};

/// What one spawn of a role instance gets.
struct role_context {
  host& node;
  const role_spec& role;
  /// Instance index within the role and its name (`<role>.<index>`).
  size_t index = 0;
  std::string name;
  /// 0 at the first start, +1 at every respawn.
  int generation = 0;
  /// A role-defined variant the supervisor may change on respawn (a stage peer's stage, after
  /// rebalancing); starts at the role's choice (`initial_variant`).
  uint64_t variant = 0;
  /// Seed of this instance and generation (derived from the run's seed).
  uint64_t seed = 0;

  /// A generator seeded for this instance and generation.
  std::mt19937_64 rng() const { return std::mt19937_64{seed}; }
  /// Whether this start must fetch its state from live peers (respawn with download_state).
  bool download_state() const { return generation > 0 && role.restart.download_state; }
  /// The address of instance `i` of `role` (`@<node>/<role>.<i>`), for the resolver.
  std::string address_of(const std::string& role, size_t i) const;
  /// The addresses of every instance of `role` the plan places on a node.
  std::vector<std::string> addresses_of(const std::string& role) const;
  /// The DHT key prefix of this run (`<experiment>`), so roles of one run meet under it.
  std::string key_prefix() const;
};

/// A registered role type.
struct role_type {
  std::string name;
  /// One line for `starling plan` and help texts.
  std::string summary;
  /// The options type (checked when a graph built in C++ hands one in).
  const std::type_info* options_type = nullptr;
  /// A default options value.
  std::function<std::any()> make_default;
  /// Reads the options from a YAML map strictly (throws config_error naming the line).
  std::function<void(config_node&, std::any&)> read;
  /// Checks an options value (the C++ front door's validation; YAML reads call it too).
  std::function<status(const std::any&)> check;
  /// Spawns one instance.
  std::function<caf::actor(role_context&, const std::any&)> spawn;
  /// The variant of instance i at its first start (0 unless the role says otherwise).
  std::function<uint64_t(const std::any&, size_t)> initial_variant;
  /// One line describing the options, for `starling plan`.
  std::function<std::string(const std::any&)> describe;
  /// Instances that may change variant (stage peers moving between stages): fills the node
  /// supervisor's rebalancing settings and returns true, or false for none (unset: none).
  std::function<bool(host&, const std::any&, actors::supervisor::rebalancing_options&)>
    rebalancing;
};

/// Context of a kind shorthand's expansion.
struct expand_context {
  /// The mode the run is for (a kind may pick backends by mode, e.g. modeled compute in sim).
  run_mode mode = run_mode::local;
  /// The file's `experiment:` section as read (name, seed, duration, nodes).
  const experiment_options* experiment = nullptr;
};

/// A kind shorthand: the section named after it expands into roles, faults and reporters.
struct kind_type {
  std::string name;
  std::string summary;
  /// Expands the section `n` into `g` (roles, faults, events, reporters); throws config_error.
  std::function<void(config_node& n, experiment_graph& g, const expand_context& ctx)> expand;
};

/// The role types and kinds a run may use.
class role_registry {
public:
  /// Registers role type `name` with options `Options`: `spawn` starts an instance, `read`
  /// fills options from YAML (null: the role takes no options), `check` validates them (null:
  /// always valid), `describe` prints them (null: nothing), `initial_variant` gives instance
  /// i's first variant (null: 0). Returns the entry.
  template <class Options>
  role_type& add(std::string name, std::string summary,
           std::function<caf::actor(role_context&, const Options&)> spawn,
           std::function<void(config_node&, Options&)> read = {},
           std::function<status(const Options&)> check = {},
           std::function<std::string(const Options&)> describe = {},
           std::function<uint64_t(const Options&, size_t)> initial_variant = {}) {
    role_type t;
    t.name = name;
    t.summary = std::move(summary);
    t.options_type = &typeid(Options);
    t.make_default = [] { return std::any{Options{}}; };
    t.read = [read, name](config_node& n, std::any& out) {
      auto& o = std::any_cast<Options&>(out);
      if (read)
        read(n, o);
    };
    t.check = [check](const std::any& a) -> status {
      return check ? check(std::any_cast<const Options&>(a)) : status{};
    };
    t.spawn = [spawn](role_context& ctx, const std::any& a) {
      return spawn(ctx, std::any_cast<const Options&>(a));
    };
    t.initial_variant = [initial_variant](const std::any& a, size_t i) -> uint64_t {
      return initial_variant ? initial_variant(std::any_cast<const Options&>(a), i) : 0;
    };
    t.describe = [describe](const std::any& a) -> std::string {
      return describe ? describe(std::any_cast<const Options&>(a)) : std::string{};
    };
    return add_type(std::move(t));
  }
  /// Registers a message type the registry's roles send between nodes, under its wire name
  /// (every node of a run registers the same ones; an unregistered type cannot cross nodes).
  template <class T>
  void add_message_type(std::string wire_name) {
    message_types_.push_back([wire_name](caf::actor_system_config& cfg) {
      cfg.add_message_type<T>(wire_name);
    });
  }
  /// Applies the registered message types to a CAF config (runners call it for every system).
  void configure(caf::actor_system_config& cfg) const;
  /// Registers a type given as a whole (replaces one of the same name).
  role_type& add_type(role_type t);
  /// Registers a kind shorthand.
  void add_kind(kind_type k);
  const role_type* find(const std::string& name) const;
  const kind_type* find_kind(const std::string& name) const;
  /// Names of the registered role types and kinds (sorted).
  std::vector<std::string> type_names() const;
  std::vector<std::string> kind_names() const;

private:
  std::map<std::string, role_type> types_;
  std::map<std::string, kind_type> kinds_;
  std::vector<std::function<void(caf::actor_system_config&)>> message_types_;
};

/// The role types and kinds starling ships: `ping` (ping.echo, ping.pinger), `swarm`
/// (swarm.stage, swarm.trainer), `masha` and `masha-adversarial` (vi.server, vi.worker).
role_registry builtin_registry();

} // namespace starling::runtime
