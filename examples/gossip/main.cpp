// Gossip averaging of a linear model over 8 peers with preemptions, written only against
// starling's public API (roles, the graph builder, reporters). Each peer fits y = x·w on its own
// seeded data by gradient steps and, every few steps, averages its weights with a random peer;
// a preempted peer comes back and starts from a live peer's weights.
//   example_gossip [--sim] [--seed S]                run in one process (local or simulated)
//   example_gossip node --index I --nodes 4 [--join HOST:PORT]   one node of a cluster run
#include <cmath>
#include <random>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/experiment/reporter.hpp"

using namespace starling;
using namespace starling::runtime;
using weights = std::vector<double>;

struct gossip_options {
  int64_t dim = 16;
  int64_t samples = 64;
  double lr = 0.05;
  std::chrono::milliseconds step{100};
  int64_t gossip_every = 5; // steps
};

struct peer_state {
  weights w, truth;
  std::vector<weights> x;
  std::vector<double> y;
  std::mt19937_64 rng;
  int64_t steps = 0;
  bool ready = true; // false until a restarted peer has a live peer's weights
};

caf::behavior gossip_peer(caf::stateful_actor<peer_state>* self, role_context ctx, gossip_options o) {
  auto& s = self->state;
  s.rng.seed(ctx.seed);
  std::mt19937_64 truth_rng{ctx.node.graph().seed}; // the same model for every peer
  std::mt19937_64 data_rng{ctx.node.graph().seed * 31 + ctx.index};
  std::normal_distribution<double> z;
  s.truth.resize(o.dim);
  for (auto& v : s.truth) v = z(truth_rng);
  s.w.assign(o.dim, 0.0);
  for (int64_t i = 0; i < o.samples; ++i) {
    weights xi(o.dim);
    double yi = 0;
    for (int64_t j = 0; j < o.dim; ++j) yi += (xi[j] = z(data_rng)) * s.truth[j];
    s.x.push_back(xi);
    s.y.push_back(yi + 0.01 * z(data_rng));
  }
  auto peers = ctx.addresses_of(ctx.role.name);
  auto own = ctx.address_of(ctx.role.name, ctx.index);
  peers.erase(std::remove(peers.begin(), peers.end(), own), peers.end());
  auto resolver = ctx.node.resolver();
  auto sink = ctx.node.metrics();
  auto name = ctx.name;
  // Averages with a random peer; a restarted peer (not ready) takes the peer's weights instead.
  auto average_with_random_peer = [=] {
    auto target = peers[std::uniform_int_distribution<size_t>{0, peers.size() - 1}(self->state.rng)];
    self->request(resolver, std::chrono::seconds(2), resolve_atom::value, target)
      .then([=](const caf::actor& peer) {
        self->request(peer, std::chrono::seconds(2), get_atom::value).then([=](const weights& other) {
          auto& w = self->state.w;
          if (other.size() == w.size())
            for (size_t j = 0; j < w.size(); ++j)
              w[j] = self->state.ready ? 0.5 * (w[j] + other[j]) : other[j];
          self->state.ready = true;
        }, [](caf::error&) {});
      }, [](caf::error&) {});
  };
  self->state.ready = !ctx.download_state();
  self->send(self, tick_atom::value);
  return {
    [=](tick_atom) {
      auto& s = self->state;
      self->delayed_send(self, o.step, tick_atom::value);
      if (!s.ready) { // keep asking until a live peer answers
        average_with_random_peer();
        return;
      }
      weights g(o.dim, 0.0);
      for (size_t i = 0; i < s.x.size(); ++i) {
        double err = -s.y[i];
        for (int64_t j = 0; j < o.dim; ++j) err += s.x[i][j] * s.w[j];
        for (int64_t j = 0; j < o.dim; ++j) g[j] += 2 * err * s.x[i][j] / s.x.size();
      }
      for (int64_t j = 0; j < o.dim; ++j) s.w[j] -= o.lr * g[j];
      if (++s.steps % o.gossip_every == 0)
        average_with_random_peer();
      double d = 0, n = 0;
      for (int64_t j = 0; j < o.dim; ++j) {
        d += (s.w[j] - s.truth[j]) * (s.w[j] - s.truth[j]);
        n += s.truth[j] * s.truth[j];
      }
      self->send(sink, messages::metric_event{name, "error", {{"error", d / n}}, {}});
    },
    [=](get_atom) -> caf::result<weights> {
      if (!self->state.ready)
        return caf::make_error(caf::sec::runtime_error, "starting");
      return self->state.w;
    },
  };
}

/// The mean relative error of the peers' latest reports; success when it fell 100-fold.
class gossip_reporter : public reporter {
public:
  void on_metric(const metric_record& m) override {
    if (m.kind == "error") latest_[m.source] = m.value("error");
    if (m.kind == "fault") faults_++;
  }
  bool tick(double t) override {
    if (first_ < 0 && !latest_.empty()) first_ = mean();
    if (t >= next_) {
      next_ += 5;
      fmt::print("  {:5.1f} s: mean relative error {:.3e} over {} peers, {} faults\n", t, mean(),
                 latest_.size(), faults_);
    }
    return false;
  }
  int finish(finish_context& ctx) override {
    fmt::print("gossip: relative error {:.3e} -> {:.3e} ({} faults, {:.1f} s)\n", first_, mean(),
               faults_, ctx.run_s);
    return first_ > 0 && mean() < first_ / 100 ? 0 : 1;
  }

private:
  double mean() const {
    double s = 0;
    for (auto& [k, v] : latest_) s += v;
    return latest_.empty() ? 0 : s / latest_.size();
  }
  std::map<std::string, double> latest_;
  double first_ = -1, next_ = 5;
  int faults_ = 0;
};

int main(int argc, char** argv) {
  role_registry reg;
  reg.add_message_type<weights>("gossip.weights");
  reg.add<gossip_options>("gossip.peer", "fits a linear model and gossip-averages it",
                          [](role_context& ctx, const gossip_options& o) {
                            return ctx.node.system().spawn(gossip_peer, ctx, o);
                          });
  return experiment_main(argc, argv, reg, [&](run_mode mode) {
    experiment_builder b{"gossip"};
    b.seed(1).duration(std::chrono::seconds(10)).nodes(4);
    b.role("peer", "gossip.peer", gossip_options{}).replicas(8).restart_delay(std::chrono::seconds(1));
    b.preempt("peer", std::chrono::seconds(3));
    b.reporter([] { return std::make_unique<gossip_reporter>(); });
    return b.build(reg, mode);
  });
}
