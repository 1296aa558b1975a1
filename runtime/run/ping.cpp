// The `ping` kind: every node runs an echo and a pinger (actors/ping); each pinger pings a random
// other echo every `interval` with `payload` bytes and reports the round trip (or the loss) as a
// metric. A network check, and the small role the fault matrix test runs every (fault kind,
// mode) pair on.
#include "runtime/run/kinds.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <fmt/format.h>

#include "actors/ping/ping.hpp"
#include "runtime/experiment/reporter.hpp"

namespace starling::runtime {

namespace {

/// The round trips of every pinger: a table at the end.
class ping_reporter : public reporter {
public:
  void start(const run_info& info) override { mode_ = info.mode; }

  void on_metric(const metric_record& m) override {
    if (m.kind == "ping")
      rtt_ms_.push_back(m.value("rtt_ms"));
    else if (m.kind == "lost")
      lost_++;
    else if (m.kind == "fault")
      faults_++;
    else if (m.kind == "restart")
      restarts_++;
  }

  bool tick(double t) override {
    if (t >= next_) {
      next_ = t + 10;
      fmt::print(stderr, "  {:6.1f} s: {} replied, {} lost\n", t, rtt_ms_.size(), lost_);
    }
    return false;
  }

  int finish(finish_context& ctx) override {
    auto rtts = rtt_ms_;
    std::sort(rtts.begin(), rtts.end());
    auto pct = [&](double q) {
      return rtts.empty() ? 0.0 : rtts[static_cast<size_t>(q * static_cast<double>(rtts.size() - 1))];
    };
    double mean = 0;
    for (auto r : rtts)
      mean += r;
    mean = rtts.empty() ? 0 : mean / static_cast<double>(rtts.size());
    fmt::print("\nping summary ({} mode, {:.1f} s of run time, {:.2f} s wall)\n", to_string(mode_),
               ctx.run_s, ctx.wall_s);
    fmt::print("  {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7} {:>9}\n", "sent",
               "replied", "lost", "mean ms", "p50 ms", "p99 ms", "max ms", "faults", "restarts");
    fmt::print("  {:>8} {:>8} {:>8} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>7} {:>9}\n",
               rtts.size() + lost_, rtts.size(), lost_, mean, pct(0.5), pct(0.99), pct(1.0),
               faults_, restarts_);
    return 0;
  }

private:
  run_mode mode_ = run_mode::local;
  std::vector<double> rtt_ms_;
  uint64_t lost_ = 0;
  uint64_t faults_ = 0;
  uint64_t restarts_ = 0;
  double next_ = 10;
};

/// The keys the `ping:` section and a pinger's options share.
void read_ping_timing(config_node& n, ping_options& out) {
  if (n.has("payload"))
    out.payload = n.child("payload").as_bytes();
  read_duration(n, "interval", out.interval);
  read_duration(n, "timeout", out.timeout);
}

void read_pinger(config_node& n, ping_options& out) {
  read_ping_timing(n, out);
  read(n, "targets", out.targets);
}

status check_pinger(const ping_options& o) {
  if (o.interval <= std::chrono::nanoseconds{0} || o.timeout <= std::chrono::nanoseconds{0})
    return fail("interval and timeout must be positive durations");
  if (o.payload > (64u << 20))
    return fail(fmt::format("payload {} B is above 64 MiB", o.payload));
  return {};
}

} // namespace

void add_ping(role_registry& reg) {
  reg.add<ping_options>(
    "ping.echo", "answers every ping with its payload",
    [](role_context& ctx, const ping_options&) {
      return actors::ping::spawn_echo(ctx.node.system());
    });
  reg.add<ping_options>(
    "ping.pinger", "pings a random instance of the `targets` role every `interval`",
    [](role_context& ctx, const ping_options& o) {
      actors::ping::pinger_options po;
      po.name = ctx.name;
      for (auto& a : ctx.addresses_of(o.targets))
        if (a.rfind(fmt::format("@{}/", ctx.node.index()), 0) != 0) // not its own node's
          po.targets.push_back(a);
      po.payload = o.payload;
      po.interval = caf::timespan{o.interval};
      po.timeout = caf::timespan{o.timeout};
      po.seed = ctx.seed;
      po.resolver = ctx.node.resolver();
      po.sink = ctx.node.metrics();
      return actors::ping::spawn_pinger(ctx.node.system(), std::move(po));
    },
    read_pinger, check_pinger,
    [](const ping_options& o) {
      return fmt::format("{} B every {:.2f} s to {}", o.payload,
                         std::chrono::duration<double>(o.interval).count(), o.targets);
    });
  kind_type k;
  k.name = "ping";
  k.summary = "nodes exchange timed pings through the network model or loopback";
  k.expand = [](config_node& n, experiment_graph& g, const expand_context&) {
    int64_t nodes = 4;
    read_int(n, "nodes", nodes, 2, 10000);
    ping_options o;
    read_ping_timing(n, o); // the kind aims every pinger at the echoes
    if (auto st = check_pinger(o); !st)
      n.fail(st.what());
    o.targets = "echo";
    g.nodes = static_cast<size_t>(nodes);
    role_spec echo;
    echo.name = "echo";
    echo.type = "ping.echo";
    echo.replicas = static_cast<size_t>(nodes);
    echo.options = o;
    role_spec pinger;
    pinger.name = "pinger";
    pinger.type = "ping.pinger";
    pinger.replicas = static_cast<size_t>(nodes);
    pinger.options = o;
    pinger.placement.colocate = "echo";
    g.roles.push_back(echo);
    g.roles.push_back(pinger);
    g.reporters.push_back([] { return std::make_unique<ping_reporter>(); });
  };
  reg.add_kind(std::move(k));
}

} // namespace starling::runtime
