// Local mode: the plan's nodes are logical nodes of one actor system in real time. Each has a
// directory of named actors and the node-level services; a resolver finds `@<node>/<name>` and
// `node<i>:1/<name>` in the directories, so roles address each other as in the other modes.
// Killing a node kills everything it adopted; restarting it starts its share again.
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "runtime/experiment/node_runtime.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/watch.hpp"
#include "runtime/log/log.hpp"
#include "runtime/node/address.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

/// The directories of the run's logical nodes, by index (fixed for the run).
struct local_directory {
  std::vector<caf::actor> dirs;

  /// The directory and the name an address points to, or why there is none.
  caf::expected<std::pair<caf::actor, std::string>> find(const std::string& address) const {
    if (auto inst = instance_address::parse(address)) {
      if (inst->node < 0 || static_cast<size_t>(inst->node) >= dirs.size())
        return caf::make_error(caf::sec::cannot_connect_to_node,
                               "no node for address " + address);
      return std::make_pair(dirs[static_cast<size_t>(inst->node)], inst->name);
    }
    auto addr = peer_address::parse(address);
    if (!addr)
      return caf::make_error(caf::sec::invalid_argument, addr.error().what);
    if (addr->port == 1 && addr->host.rfind("node", 0) == 0) {
      auto num = addr->host.substr(4);
      size_t i = 0;
      bool ok = !num.empty() && num.size() < 9;
      for (char c : num) {
        ok = ok && c >= '0' && c <= '9';
        i = i * 10 + static_cast<size_t>(c - '0');
      }
      if (ok && i < dirs.size())
        return std::make_pair(dirs[i], addr->name);
    }
    return caf::make_error(caf::sec::cannot_connect_to_node, "no node at " + addr->endpoint());
  }
};

caf::behavior local_resolver(caf::event_based_actor* self,
                             std::shared_ptr<const local_directory> dir) {
  return {
    [=](resolve_atom, const std::string& address) -> caf::result<caf::actor> {
      auto target = dir->find(address);
      if (!target)
        return std::move(target.error());
      auto rp = self->make_response_promise<caf::actor>();
      self->request(target->first, std::chrono::seconds(5), get_atom::value, target->second)
        .then([rp](const caf::actor& a) mutable { rp.deliver(a); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      return rp;
    },
  };
}

class local_host : public threaded_host {
public:
  local_host(caf::actor_system& sys, size_t index, caf::actor directory, caf::actor resolver,
             const experiment_graph& g, const struct plan& p, caf::actor_clock::time_point t0,
             std::map<std::string, caf::actor>& shared, std::vector<size_t>& dht_nodes,
             std::mutex& shared_mtx)
    : threaded_host(std::move(directory)),
      sys_(sys),
      index_(index),
      name_(fmt::format("node{}", index)),
      resolver_(std::move(resolver)),
      graph_(g),
      plan_(p),
      t0_(t0),
      shared_(shared),
      dht_nodes_(dht_nodes),
      shared_mtx_(shared_mtx) {
    // nop
  }

  caf::actor_system& system() override { return sys_; }
  run_mode mode() const override { return run_mode::local; }
  size_t index() const override { return index_; }
  const std::string& name() const override { return name_; }
  std::string endpoint() const override { return name_ + ":1"; }
  caf::actor resolver() override { return resolver_; }
  caf::actor metrics() override { return sink; }

  caf::actor dht() override {
    caf::actor made;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (dht_)
        return dht_;
      actors::dht::dht_options d;
      d.address = endpoint() + "/dht";
      d.id = actors::dht::identity::from_seed(plan_.seed * 7919 + index_);
      {
        std::lock_guard<std::mutex> shared_guard{shared_mtx_};
        d.bootstrap = bootstrap_from(dht_nodes_, index_);
        dht_nodes_.push_back(index_);
      }
      dht_ = made = actors::dht::spawn_dht(sys_, resolver_, d);
    }
    put("dht", made); // takes the lock itself
    return made;
  }

  caf::actor spawn_averager(const std::string& name,
                            actors::averager::averager_options opts) override {
    opts.address = endpoint() + "/" + name;
    auto a = actors::averager::spawn_averager(sys_, dht(), resolver_, opts);
    put(name, a);
    return a;
  }

  caf::actor view(const caf::actor& a) override { return a; }

  caf::actor shared_service(const std::string& name,
                            const std::function<caf::actor()>& make) override {
    std::lock_guard<std::mutex> guard{shared_mtx_};
    if (auto i = shared_.find(name); i != shared_.end())
      return i->second;
    auto a = make();
    shared_[name] = a;
    return a;
  }

  const experiment_graph& graph() const override { return graph_; }
  const struct plan& plan() const override { return plan_; }
  nanoseconds elapsed() override { return sys_.clock().now() - t0_; }

  caf::actor directory() const { return directory_; }
  bool alive() const { return alive_; }

  void start(const role_registry& registry, metric_hub& hub) {
    alive_ = true;
    sink = spawn_metric_sink(*this, [&hub](const metric_record& m) { hub.deliver(m); }, "");
    put("metrics", sink);
    std::vector<size_t> kills;
    for (auto f : plan_.faults_of(index_))
      if (plan_.faults[f].what == planned_fault::action::kill_instance)
        kills.push_back(f);
    start_node_share(*this, registry, incarnation_++, std::move(kills));
  }

  /// Kills every actor of the node (`reason` kill for a fault, user_shutdown at the end).
  void stop(caf::exit_reason reason) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      dht_ = nullptr;
    }
    alive_ = false;
    stop_all(reason);
  }

private:
  caf::actor_system& sys_;
  size_t index_;
  std::string name_;
  caf::actor resolver_;
  const experiment_graph& graph_;
  const struct plan& plan_;
  caf::actor_clock::time_point t0_;
  std::map<std::string, caf::actor>& shared_;
  std::vector<size_t>& dht_nodes_;
  std::mutex& shared_mtx_;
  caf::actor dht_;
  int incarnation_ = 0;
  bool alive_ = false;
};

/// Asks actors with a blocking request (real time).
class local_finish : public finish_context {
public:
  local_finish(caf::actor_system& sys, local_host& node, const local_directory& dirs)
    : sys_(sys), node_(node), dirs_(dirs) {}

  std::vector<caf::actor> live(const std::string& role) override {
    std::vector<caf::actor> out;
    auto& g = node_.graph();
    auto& p = node_.plan();
    caf::scoped_actor self{sys_};
    for (size_t r = 0; r < g.roles.size(); ++r) {
      if (g.roles[r].name != role)
        continue;
      for (auto i : p.of_role(r)) {
        auto& x = p.instances[i];
        if (!x.node || *x.node >= dirs_.dirs.size())
          continue;
        self->request(dirs_.dirs[*x.node], std::chrono::seconds(2), get_atom::value, x.name)
          .receive([&](const caf::actor& a) { out.push_back(a); }, [](caf::error&) {});
      }
    }
    return out;
  }

  void run(std::function<void(caf::event_based_actor*)> body, nanoseconds timeout) override {
    run_and_wait(sys_, body, timeout);
  }

  host& node() override { return node_; }

private:
  caf::actor_system& sys_;
  local_host& node_;
  const local_directory& dirs_;
};

} // namespace

run_result run_local(const experiment_graph& g, const role_registry& registry, const plan& p,
                     const run_settings& s) {
  auto wall0 = std::chrono::steady_clock::now();
  run_result res;
  // The endpoint first: a port in use or a bad address fails the run before anything starts.
  auto reporters = make_reporters(g);
  auto served = watch_if_asked(g, p, run_mode::local, reporters);
  if (!served) {
    fmt::print(stderr, "starling: {}\n", served.error().what);
    res.exit_code = 1;
    return res;
  }
  auto watch = std::move(*served);
  caf::actor_system_config cfg;
  configure_system(cfg, g.caf, false);
  registry.configure(cfg);
  // The system goes first at the end (it waits for its actors, which use the hub and hosts).
  auto sys_ptr = std::make_unique<caf::actor_system>(cfg);
  auto& sys = *sys_ptr;
  metric_hub hub{std::move(reporters), s.out_dir.empty() ? "" : s.out_dir + "/metrics.jsonl"};
  auto total = p.total_nodes();
  auto dirs = std::make_shared<local_directory>();
  for (size_t n = 0; n < total; ++n)
    dirs->dirs.push_back(spawn_directory(sys));
  auto resolver = sys.spawn(local_resolver, std::shared_ptr<const local_directory>(dirs));
  std::map<std::string, caf::actor> shared;
  std::vector<size_t> dht_nodes;
  std::mutex shared_mtx;
  auto t0 = sys.clock().now();
  std::vector<std::unique_ptr<local_host>> hosts;
  for (size_t n = 0; n < total; ++n) {
    hosts.push_back(std::make_unique<local_host>(sys, n, dirs->dirs[n], resolver, g, p, t0, shared,
                                                 dht_nodes, shared_mtx));
    if (!s.out_dir.empty())
      hosts.back()->dir = s.out_dir + "/" + hosts.back()->name();
  }
  run_info info;
  info.graph = &g;
  info.plan = &p;
  info.mode = run_mode::local;
  info.out_dir = s.out_dir;
  info.tty = ::isatty(2) != 0;
  hub.start(info);
  for (auto& h : hosts)
    h->start(registry, hub);
  // The page also reads the peers' ledger summaries, as any node's page does (node 0's DHT).
  if (watch)
    if (auto r = watch->read_ledger(sys, hosts.front()->dht(), g.node.ledger_every))
      hosts.front()->adopt(r);
  // Node kills and restarts happen on this thread at their times (real time).
  std::multimap<nanoseconds, std::pair<size_t, bool>> node_actions; // time -> (node, restart?)
  for (auto& f : p.faults)
    if (f.what == planned_fault::action::kill_node) {
      node_actions.emplace(f.at, std::make_pair(f.node, false));
      if (!f.never)
        node_actions.emplace(f.at + f.restart, std::make_pair(f.node, true));
    }
  bool done = false;
  bool stopped = false;
  double next_tick = 1.0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (s.stop && s.stop()) {
      stopped = true;
      log(log_level::info, "run", "stopping on a signal");
      break;
    }
    auto now = sys.clock().now() - t0;
    while (!node_actions.empty() && node_actions.begin()->first <= now) {
      auto [n, restart] = node_actions.begin()->second;
      node_actions.erase(node_actions.begin());
      auto& h = *hosts[n];
      metric_record m;
      m.t = seconds_of(now);
      m.node = n;
      m.source = fmt::format("node{}/faults", n);
      m.kind = restart ? "restart_node" : "fault";
      m.labels["action"] = "kill_node";
      m.labels["node"] = fmt::format("node{}", n);
      hub.deliver(m);
      if (restart && !h.alive()) {
        log(log_level::info, "run", "node{} restarts", n);
        h.start(registry, hub);
      } else if (!restart && h.alive()) {
        log(log_level::info, "run", "node{} killed (fault)", n);
        h.stop(caf::exit_reason::kill);
      }
    }
    if (seconds_of(now) >= next_tick) {
      next_tick += 1.0;
      done = hub.tick(seconds_of(now));
    }
    if (done || now >= g.duration)
      break;
  }
  res.run_s = seconds_of(sys.clock().now() - t0);
  res.timed_out = !done && !stopped;
  local_finish fin{sys, *hosts[0], *dirs};
  fin.run_s = res.run_s;
  fin.timed_out = !done && !stopped;
  fin.stopped = stopped;
  fin.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  res.exit_code = hub.finish(fin);
  for (auto& h : hosts)
    h->stop(caf::exit_reason::user_shutdown);
  for (auto& [name, a] : shared)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(resolver, caf::exit_reason::user_shutdown);
  for (auto& d : dirs->dirs)
    caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
  sys_ptr.reset();
  // Every metric is in: the ledger's file gets the peers' last numbers.
  hub.close();
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

} // namespace starling::runtime
