#include "runtime/run/ping_workload.hpp"

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/sim/world.hpp"

namespace starling::runtime {

namespace {

using messages::blob_msg;

/// Round trips of all pingers of a run; pingers die and restart, the totals stay.
struct ping_totals {
  std::mutex mtx;
  std::vector<int64_t> rtt_ns;
  uint64_t sent = 0;
  uint64_t lost = 0;
};

caf::behavior echo_actor(caf::event_based_actor*) {
  return {[](const blob_msg& m) { return blob_msg{"pong", m.bytes}; }};
}

struct pinger_state {
  std::mt19937_64 rng;
  std::map<std::string, caf::actor> peers;
};

caf::behavior pinger_actor(caf::stateful_actor<pinger_state>* self, caf::actor resolver,
                           std::vector<std::string> targets, ping_options opts, uint64_t seed,
                           std::shared_ptr<ping_totals> totals) {
  self->state.rng.seed(seed);
  auto interval = caf::timespan{opts.interval};
  auto timeout = caf::timespan{opts.timeout};
  auto lost = [=](const std::string& target) {
    self->state.peers.erase(target);
    std::lock_guard<std::mutex> g{totals->mtx};
    totals->lost++;
  };
  auto ping = [=](const caf::actor& peer, const std::string& target) {
    auto t0 = self->clock().now();
    {
      std::lock_guard<std::mutex> g{totals->mtx};
      totals->sent++;
    }
    self->request(peer, timeout, blob_msg{"ping", std::vector<char>(opts.payload, 'p')})
      .then(
        [=](const blob_msg&) {
          auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now()
                                                                          - t0);
          std::lock_guard<std::mutex> g{totals->mtx};
          totals->rtt_ns.push_back(rtt.count());
        },
        [=](caf::error&) { lost(target); });
  };
  self->delayed_send(self, interval, tick_atom::value);
  return {
    [=](tick_atom) {
      self->delayed_send(self, interval, tick_atom::value);
      if (targets.empty())
        return;
      std::uniform_int_distribution<size_t> pick{0, targets.size() - 1};
      auto target = targets[pick(self->state.rng)];
      if (auto i = self->state.peers.find(target); i != self->state.peers.end()) {
        ping(i->second, target);
        return;
      }
      self->request(resolver, timeout, resolve_atom::value, target)
        .then(
          [=](const caf::actor& peer) {
            self->state.peers[target] = peer;
            ping(peer, target);
          },
          [=](caf::error&) {
            std::lock_guard<std::mutex> g{totals->mtx};
            totals->sent++;
            totals->lost++;
          });
    },
  };
}

void summarize(const ping_totals& t, const ping_options& opts, jsonl_writer& out,
               const std::string& mode, double seconds) {
  auto rtts = t.rtt_ns;
  std::sort(rtts.begin(), rtts.end());
  auto pct = [&](double q) -> double {
    if (rtts.empty())
      return 0;
    auto idx = static_cast<size_t>(q * static_cast<double>(rtts.size() - 1));
    return static_cast<double>(rtts[idx]) / 1e6;
  };
  double mean = 0;
  for (auto r : rtts)
    mean += static_cast<double>(r) / 1e6;
  mean = rtts.empty() ? 0 : mean / static_cast<double>(rtts.size());
  fmt::print("\nping summary ({} mode, {} nodes, {} B payload, {:.1f} s)\n", mode, opts.nodes,
             opts.payload, seconds);
  fmt::print("  {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "sent", "replied", "lost",
             "mean ms", "p50 ms", "p99 ms", "max ms");
  fmt::print("  {:>8} {:>8} {:>8} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", t.sent,
             rtts.size(), t.lost, mean, pct(0.5), pct(0.99), pct(1.0));
  out.write({{"event", "summary"}, {"sent", t.sent}, {"replied", rtts.size()},
             {"lost", t.lost}, {"rtt_mean_ms", mean}, {"rtt_p50_ms", pct(0.5)},
             {"rtt_p99_ms", pct(0.99)}});
}

int run_sim(const experiment_config& cfg, const ping_options& opts, const run_context& ctx,
            jsonl_writer& out) {
  sim::world_options wo;
  wo.seed = cfg.experiment.seed;
  wo.network = cfg.network;
  sim::world w{wo};
  auto totals = std::make_shared<ping_totals>();
  std::vector<std::string> names;
  for (int64_t i = 0; i < opts.nodes; ++i)
    names.push_back(fmt::format("node{}", i));
  for (int64_t i = 0; i < opts.nodes; ++i) {
    auto& n = w.add_node(names[static_cast<size_t>(i)]);
    std::vector<std::string> targets;
    for (auto& other : names)
      if (other != n.name())
        targets.push_back(other + ":1/echo");
    auto seed = cfg.experiment.seed * 7919 + static_cast<uint64_t>(i);
    n.on_start([=](sim::sim_node& self) {
      self.spawn("echo", echo_actor);
      self.spawn("pinger", pinger_actor, self.resolver(), targets, opts, seed, totals);
    });
  }
  w.schedule_faults(cfg.faults, cfg.experiment.duration);
  auto wall0 = std::chrono::steady_clock::now();
  auto step = std::chrono::nanoseconds{cfg.experiment.duration.count() / 10 + 1};
  while (w.elapsed() < cfg.experiment.duration) {
    w.run_for(std::min(step, cfg.experiment.duration - w.elapsed()));
    std::lock_guard<std::mutex> g{totals->mtx};
    log(log_level::info, "ping", "virtual {:.1f} s: {} sent, {} replied, {} lost",
        std::chrono::duration<double>(w.elapsed()).count(), totals->sent,
        totals->rtt_ns.size(), totals->lost);
  }
  auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  w.write_trace_jsonl(ctx.out_dir + "/trace.jsonl");
  summarize(*totals, opts, out, "sim", std::chrono::duration<double>(w.elapsed()).count());
  fmt::print("  simulated {:.1f} s in {:.2f} s of wall time; trace: {}/trace.jsonl ({} events)\n",
             std::chrono::duration<double>(w.elapsed()).count(), wall, ctx.out_dir,
             w.trace().size());
  return 0;
}

int run_local(const experiment_config& cfg, const ping_options& opts, jsonl_writer& out) {
  std::vector<std::unique_ptr<node>> nodes;
  for (int64_t i = 0; i < opts.nodes; ++i) {
    node_options no;
    no.listen = "127.0.0.1:0";
    auto n = node::start(cfg.caf, no, fmt::format("node{}", i));
    if (!n) {
      log(log_level::error, "ping", "{}", n.error().what);
      return 1;
    }
    nodes.push_back(std::move(*n));
  }
  auto totals = std::make_shared<ping_totals>();
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto& n = *nodes[i];
    n.register_actor("echo", n.system().spawn(echo_actor));
    std::vector<std::string> targets;
    for (auto& other : nodes)
      if (other.get() != &n)
        targets.push_back(other->endpoint() + "/echo");
    n.register_actor("pinger", n.system().spawn(pinger_actor, n.resolver(), targets, opts,
                                                cfg.experiment.seed * 7919 + i, totals));
  }
  auto t0 = std::chrono::steady_clock::now();
  auto end = t0 + cfg.experiment.duration;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
      std::chrono::seconds(1), end - std::chrono::steady_clock::now()));
    std::lock_guard<std::mutex> g{totals->mtx};
    fmt::print(stderr, "\r  {:.0f} s: {} sent, {} replied, {} lost   ",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               totals->sent, totals->rtt_ns.size(), totals->lost);
  }
  fmt::print(stderr, "\n");
  nodes.clear();
  summarize(*totals, opts, out, "local",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

} // namespace

void read_options(config_node& n, ping_options& out) {
  read_int(n, "nodes", out.nodes, 2, 10000);
  if (n.has("payload"))
    out.payload = n.child("payload").as_bytes();
  read_duration(n, "interval", out.interval);
  read_duration(n, "timeout", out.timeout);
  if (out.interval.count() <= 0)
    n.child("interval").expected("a positive duration");
}

int run_ping(const experiment_config& cfg, const run_context& ctx) {
  ping_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    read_options(section, opts);
    section.finish();
  }
  jsonl_writer out{ctx.out_dir + "/metrics.jsonl"};
  if (ctx.simulate)
    return run_sim(cfg, opts, ctx, out);
  return run_local(cfg, opts, out);
}

} // namespace starling::runtime
