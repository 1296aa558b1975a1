// Simulation mode: every node of the plan is a simulated node of the virtual-time world
// (runtime/sim/world.hpp); its host services and role instances live on it, every message
// between nodes goes through the network model, and node-level faults (kill and restart a node,
// partitions, slow links) are world actions at their virtual times. Instance kills come from
// each node's fault injector on CAF's (virtual) clock, as in every mode.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "runtime/experiment/node_runtime.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/watch.hpp"
#include "runtime/sim/world.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

/// A simulated node's host. Lives for the whole run; its actors die and come back with the
/// node.
class sim_host : public node_host {
public:
  sim_host(sim::world& w, sim::sim_node& n, size_t index, const experiment_graph& g,
           const struct plan& p, std::map<std::string, caf::actor>& shared,
           std::vector<size_t>& dht_nodes)
    : world_(w),
      node_(n),
      index_(index),
      graph_(g),
      plan_(p),
      shared_(shared),
      dht_nodes_(dht_nodes) {
    // nop
  }

  caf::actor_system& system() override { return world_.system(); }
  run_mode mode() const override { return run_mode::sim; }
  size_t index() const override { return index_; }
  const std::string& name() const override { return node_.name(); }
  std::string endpoint() const override { return node_.endpoint(); }
  bool reachable() const override { return !world_.firewalled(node_.index()); }
  caf::actor resolver() override { return node_.resolver(); }
  caf::actor metrics() override { return sink; }

  caf::actor dht() override {
    if (dht_)
      return dht_;
    actors::dht::dht_options d;
    d.address = endpoint() + "/dht";
    d.id = actors::dht::identity::from_seed(plan_.seed * 7919 + index_);
    d.bootstrap = bootstrap_from(dht_nodes_, index_);
    // A node that accepts no connection serves nobody: a client of the others' DHT, and no
    // bootstrap node for later ones.
    d.client = world_.firewalled(node_.index());
    dht_ = node_.spawn("dht", actors::dht::dht_actor, node_.resolver(), d);
    if (!d.client)
      dht_nodes_.push_back(index_);
    return dht_;
  }

  void register_actor(const std::string& name, const caf::actor& a) override {
    node_.adopt(name, a);
  }

  void adopt(const caf::actor& a) override { node_.adopt("", a); }

  caf::actor service(const std::string& name,
                     const std::function<caf::actor(host&)>& make) override {
    if (auto i = services_.find(name); i != services_.end())
      return i->second;
    auto a = make(*this);
    if (a) {
      node_.adopt(name, a);
      services_[name] = a;
    }
    return a;
  }

  caf::actor spawn_averager(const std::string& name,
                            actors::averager::averager_options opts) override {
    opts.address = endpoint() + "/" + name;
    return node_.spawn(name, actors::averager::averager_actor, dht(), node_.resolver(), opts);
  }

  caf::actor view(const caf::actor& a) override {
    if (!a || world_.node_of(a.address()) == static_cast<int>(index_)
        || world_.node_of(a.address()) < 0)
      return a;
    return world_.lazy_proxy(static_cast<int>(index_), a);
  }

  caf::actor shared_service(const std::string& name,
                            const std::function<caf::actor()>& make) override {
    if (auto i = shared_.find(name); i != shared_.end())
      return i->second;
    auto a = make();
    shared_[name] = a;
    return a;
  }

  const experiment_graph& graph() const override { return graph_; }
  const struct plan& plan() const override { return plan_; }
  nanoseconds elapsed() override { return world_.elapsed(); }

  /// (Re)starts the node's actors: sink, DHT (if the run uses one), supervisor, injector.
  void start(const role_registry& registry, metric_hub& hub) {
    services_.clear();
    dht_ = nullptr;
    sink = spawn_metric_sink(*this, [&hub](const metric_record& m) { hub.deliver(m); }, "");
    node_.adopt("metrics", sink);
    std::vector<size_t> kills;
    for (auto f : plan_.faults_of(index_))
      if (plan_.faults[f].what == planned_fault::action::kill_instance)
        kills.push_back(f);
    start_node_share(*this, registry, incarnation_++, std::move(kills));
  }

private:
  sim::world& world_;
  sim::sim_node& node_;
  size_t index_;
  const experiment_graph& graph_;
  const struct plan& plan_;
  std::map<std::string, caf::actor>& shared_;
  std::vector<size_t>& dht_nodes_;
  std::map<std::string, caf::actor> services_;
  caf::actor dht_;
  int incarnation_ = 0;
};

/// Asks actors and waits on virtual time: runs the world until the reply comes.
class sim_finish : public finish_context {
public:
  sim_finish(sim::world& w, sim_host& reporter_node) : world_(w), node_(reporter_node) {}

  std::vector<caf::actor> live(const std::string& role) override {
    std::vector<caf::actor> out;
    auto& g = node_.graph();
    auto& p = node_.plan();
    for (size_t r = 0; r < g.roles.size(); ++r) {
      if (g.roles[r].name != role)
        continue;
      for (auto i : p.of_role(r)) {
        auto& x = p.instances[i];
        if (!x.node)
          continue;
        auto a = world_.resolve(static_cast<int>(node_.index()),
                                fmt::format("@{}/{}", *x.node, x.name));
        if (a)
          out.push_back(*a);
      }
    }
    return out;
  }

  void run(std::function<void(caf::event_based_actor*)> body, nanoseconds timeout) override {
    auto done = std::make_shared<bool>(false);
    auto a = world_.system().spawn([=](caf::event_based_actor* self) -> caf::behavior {
      self->attach_functor([done] { *done = true; });
      body(self);
      return {[](stop_atom) {}};
    });
    world_.run_until([&] { return *done; }, timeout);
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    world_.run();
  }

  host& node() override { return node_; }

private:
  sim::world& world_;
  sim_host& node_;
};

} // namespace

run_result run_sim(const experiment_graph& g, const role_registry& registry, const plan& p,
                   const run_settings& s) {
  auto wall0 = std::chrono::steady_clock::now();
  run_result res;
  // Firewalled nodes must be nodes of this run (`node0` ... `node<N-1>`).
  for (auto& f : g.network.firewalled) {
    bool known = false;
    for (size_t n = 0; n < p.total_nodes() && !known; ++n)
      known = f == fmt::format("node{}", n);
    if (!known) {
      fmt::print(stderr,
                 "starling: network.firewalled names '{}', not a node of this run (node0 to "
                 "node{})\n",
                 f, p.total_nodes() == 0 ? 0 : p.total_nodes() - 1);
      res.exit_code = 2;
      return res;
    }
  }
  // The endpoint first: a port in use or a bad address fails the run before anything starts.
  // Its handlers run on the server's threads and read snapshots the simulation publishes as it
  // goes, so watching never changes the simulated run (its digest stays the same).
  auto reporters = make_reporters(g);
  auto served = watch_if_asked(g, p, run_mode::sim, reporters);
  if (!served) {
    fmt::print(stderr, "starling: {}\n", served.error().what);
    res.exit_code = 1;
    return res;
  }
  auto watch = std::move(*served);
  sim::world_options wo;
  wo.seed = p.seed;
  wo.network = g.network;
  wo.trace_messages = s.trace_messages && g.trace_messages;
  // The trace goes to its file as it is recorded; only its digest and count stay in memory.
  wo.keep_trace = false;
  if (s.write_trace && !s.out_dir.empty())
    wo.trace_path = s.out_dir + "/trace.jsonl";
  wo.configure = [&registry](caf::actor_system_config& cfg) { registry.configure(cfg); };
  // A run with bans is a closed run: its world's authority signs them.
  wo.closed = std::any_of(p.faults.begin(), p.faults.end(), [](const planned_fault& f) {
    return f.what == planned_fault::action::ban;
  });
  // The world goes first at the end: its actors use the hub and the hosts until they die.
  auto world_ptr = std::make_unique<sim::world>(wo);
  auto& w = *world_ptr;
  metric_hub hub{std::move(reporters), s.out_dir.empty() ? "" : s.out_dir + "/metrics.jsonl"};
  // Metrics enter the trace (their digest covers what the roles measured).
  hub.on_deliver([&w](const metric_record& m) {
    std::string detail = m.kind;
    for (auto& [k, v] : m.values)
      detail += fmt::format(" {}={:.6g}", k, v);
    for (auto& [k, v] : m.labels)
      detail += fmt::format(" {}={}", k, v);
    w.record("metric", m.source, "", 0, detail);
  });
  // A watched run's page counts the envelopes the world refused (a banned node's), by the node
  // they came from, and shows why the authority banned a node; the world records them in its
  // trace only, and watching leaves that as is.
  if (watch)
    w.on_record([wp = watch.get()](const sim::trace_event& e) {
      if (e.kind == "ban") {
        metric_record m;
        m.t = static_cast<double>(e.t_ns) / 1e9;
        m.source = e.from + "/faults";
        m.kind = "node_banned";
        m.labels["node"] = e.from;
        m.labels["reason"] = e.detail;
        wp->note(m);
        return;
      }
      if (e.kind != "refused")
        return;
      metric_record m;
      m.t = static_cast<double>(e.t_ns) / 1e9;
      m.source = e.to + "/gate";
      m.kind = "refused";
      m.labels["reason"] = e.detail.substr(0, e.detail.find(':'));
      m.labels["from_node"] = e.from;
      wp->note(m);
    });
  std::map<std::string, caf::actor> shared;
  std::vector<std::unique_ptr<sim_host>> hosts;
  std::vector<size_t> dht_nodes;
  auto total = p.total_nodes();
  for (size_t n = 0; n < total; ++n) {
    auto& sn = w.add_node(fmt::format("node{}", n));
    hosts.push_back(std::make_unique<sim_host>(w, sn, n, g, p, shared, dht_nodes));
    if (!s.out_dir.empty())
      hosts.back()->dir = s.out_dir + "/" + sn.name();
  }
  run_info info;
  info.graph = &g;
  info.plan = &p;
  info.mode = run_mode::sim;
  info.out_dir = s.out_dir;
  hub.start(info);
  // Start every node (its start hook runs again after each restart of the node).
  for (size_t n = 0; n < total; ++n) {
    auto* h = hosts[n].get();
    // Only the served node (node 0) reads the peers' ledger summaries, so that 10,000 simulated
    // peers do not drown in reads; and only where peers publish them (data-parallel peers):
    // another run's trace stays as it would be unwatched.
    bool reads = n == 0 && watch
                 && std::any_of(g.roles.begin(), g.roles.end(),
                                [](const role_spec& r) { return r.type == "dedloc.peer"; });
    auto* served_watch = watch.get();
    w.node(static_cast<int>(n)).on_start(
      [h, &registry, &hub, reads, served_watch, &g](sim::sim_node&) {
        h->start(registry, hub);
        if (reads)
          if (auto r = served_watch->read_ledger(h->system(), h->dht(), g.node.ledger_every))
            h->adopt(r);
      });
  }
  // Node-level faults are world actions at their virtual times, reported like the others.
  auto node_name = [](size_t n) { return fmt::format("node{}", n); };
  auto note = [&w, &hub](const planned_fault& f) {
    metric_record m;
    m.t = seconds_of(w.elapsed());
    m.node = f.node;
    m.source = fmt::format("node{}/faults", f.node);
    m.kind = "fault";
    m.labels["action"] = to_string(f.what);
    m.labels["node"] = fmt::format("node{}", f.node);
    hub.deliver(m);
  };
  for (auto& f : p.faults) {
    switch (f.what) {
      case planned_fault::action::kill_node:
        w.at(f.at, "kill_node", [&w, f, node_name, note] {
          note(f);
          w.kill_node(node_name(f.node), f.never ? nanoseconds{-1} : f.restart);
        });
        break;
      case planned_fault::action::partition:
      case planned_fault::action::heal:
        w.at(f.at, to_string(f.what), [&w, f, node_name, note] {
          note(f);
          for (size_t a = 0; a < f.groups.size(); ++a)
            for (size_t b = a + 1; b < f.groups.size(); ++b)
              for (auto x : f.groups[a])
                for (auto y : f.groups[b]) {
                  if (f.what == planned_fault::action::partition)
                    w.partition(node_name(x), node_name(y));
                  else
                    w.heal(node_name(x), node_name(y));
                }
        });
        break;
      case planned_fault::action::slow_link:
      case planned_fault::action::restore_link:
        w.at(f.at, to_string(f.what), [&w, &g, f, note] {
          note(f);
          auto link = g.network.defaults;
          if (f.what == planned_fault::action::slow_link) {
            if (f.latency > nanoseconds{0})
              link.latency = f.latency;
            if (f.bandwidth > 0)
              link.bandwidth = f.bandwidth;
          }
          w.record(to_string(f.what), fmt::format("node{}", f.node),
                   fmt::format("node{}", f.peer), 0, "");
          w.network().set_link(static_cast<int>(f.node), static_cast<int>(f.peer), link);
          w.network().set_link(static_cast<int>(f.peer), static_cast<int>(f.node), link);
        });
        break;
      case planned_fault::action::ban:
        w.at(f.at, "ban", [&w, f, node_name, note] {
          note(f);
          if (auto why = w.ban(node_name(f.node), f.reason); !why.empty())
            w.record("ban_failed", node_name(f.node), "", 0, why);
        });
        break;
      default:
        break; // instance kills: the victim's node injects them
    }
  }
  bool done = false;
  auto step = std::chrono::seconds(1);
  while (w.elapsed() < g.duration && !done) {
    w.run_for(std::min<nanoseconds>(step, g.duration - w.elapsed()));
    done = hub.tick(seconds_of(w.elapsed()));
  }
  res.run_s = seconds_of(w.elapsed());
  res.timed_out = !done;
  sim_finish fin{w, *hosts[0]};
  fin.run_s = res.run_s;
  fin.timed_out = !done;
  fin.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  res.exit_code = hub.finish(fin);
  res.trace_digest = w.trace_digest();
  res.trace_events = w.trace_events();
  res.proxies_made = w.proxies_made();
  res.unsolicited = w.unsolicited();
  if (!w.trace_error().empty())
    fmt::print(stderr, "starling: the trace is incomplete: {}\n", w.trace_error());
  for (auto& [name, a] : shared)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  world_ptr.reset();
  // Every metric is in: the ledger's file gets the peers' last numbers.
  hub.close();
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

} // namespace starling::runtime
