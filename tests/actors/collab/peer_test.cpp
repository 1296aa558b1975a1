// The collaborative optimizer's shell (actors/collab/peer.hpp) driving a model that is neither a
// stage nor a data-parallel peer: a vector pulled towards a target of its own by plain SGD. Two
// such peers on two simulated nodes (a DHT and an averager each) take their global steps
// together on averaged gradients and stay equal.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/collab/peer.hpp"
#include "actors/dht/dht.hpp"
#include "runtime/sim/world.hpp"

namespace starling::test::actors_collab_peer_test {

using namespace std::chrono_literals;
using namespace starling::actors;

namespace {

using toy_tick_atom = caf::atom_constant<caf::atom("toy_tick")>;
using toy_wake_atom = caf::atom_constant<caf::atom("toy_wake")>;

/// What a toy peer did, read by the test.
struct toy_log {
  torch::Tensor theta;
  std::vector<collab::step_basis> steps;
  uint64_t downloads = 0;
};

/// The model: theta, whose gradient per sample is theta - target; SGD at rate 0.5.
struct toy_state : collab::peer_model {
  caf::event_based_actor* self = nullptr;
  std::shared_ptr<toy_log> log;
  torch::Tensor target;
  torch::Tensor sum;
  uint64_t samples = 0;
  bool paused = false;
  std::unique_ptr<collab::peer_shell> shell;

  collab::taken_gradient_ref take_gradient(uint64_t, uint64_t n) override {
    auto mean = samples > 0 ? sum / static_cast<double>(samples) : torch::zeros_like(sum);
    sum.zero_();
    samples = 0;
    return {mean, static_cast<double>(n)};
  }
  void step(uint64_t, uint64_t, const torch::Tensor& grad, collab::step_basis basis) override {
    log->theta.sub_(grad * 0.5);
    log->steps.push_back(basis);
  }
  result<torch::Tensor> state_vector() override { return log->theta.clone(); }
  status load_state_vector(const torch::Tensor& v) override {
    log->theta.copy_(v);
    return {};
  }
  void discard_gradients() override {
    sum.zero_();
    samples = 0;
  }
  void pause() override { paused = true; }
  void resume() override { paused = false; }
  void download(const collab::download_state& d) override {
    log->downloads++;
    shell->download_failed(d.id); // peers that start together never need one
  }
  void wake_in(caf::timespan delay) override {
    self->delayed_send(self, delay, toy_wake_atom::value);
  }

  static inline const char* name = "toy_peer";
};

caf::behavior toy_peer(caf::stateful_actor<toy_state>* self, caf::actor dht, caf::actor averager,
                       std::string id, torch::Tensor target, std::shared_ptr<toy_log> log) {
  auto& s = self->state;
  s.self = self;
  s.log = log;
  s.target = target;
  s.sum = torch::zeros_like(target);
  collab::peer_shell_options so;
  so.dht = dht;
  so.averager = averager;
  so.progress_key = "toy/progress";
  so.gradient_key = [](uint64_t step) { return "toy/grad/" + std::to_string(step); };
  so.state_key = [](uint64_t step) { return "toy/state/" + std::to_string(step); };
  s.shell = std::make_unique<collab::peer_shell>(self, &s, so);
  collab::coordinator_options co;
  co.progress.target_batch = 16;
  co.progress.min_refresh = 0.2;
  co.progress.max_refresh = 0.8;
  co.progress.record_lifetime = 2;
  co.publish_interval = 0.2;
  co.read_timeout = 0.5;
  co.round_timeout = 5;
  s.shell->start(id, false, co);
  self->send(self, toy_tick_atom::value);
  return {
    // One sample every 100 ms: its gradient accumulates.
    [self](toy_tick_atom) {
      auto& st = self->state;
      self->delayed_send(self, 100ms, toy_tick_atom::value);
      if (st.paused)
        return;
      st.sum.add_(st.log->theta - st.target);
      st.samples++;
      st.shell->samples_done(1);
    },
    [self](toy_wake_atom) { self->state.shell->timer(); },
    [self](collab::collab_reread_atom) { self->state.shell->reread(); },
  };
}

} // namespace

TEST_CASE("the collaborative shell drives a model of a few lines: two peers step together on "
          "averaged gradients and stay equal") {
  runtime::sim::world_options wo;
  wo.seed = 3901;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  std::vector<std::shared_ptr<toy_log>> logs;
  for (int i = 0; i < 2; ++i) {
    auto& node = w.add_node("n" + std::to_string(i));
    dht::dht_options d;
    d.address = node.endpoint() + "/dht";
    d.id = dht::identity::from_seed(3901 * 1000 + static_cast<uint64_t>(i));
    if (i > 0)
      d.bootstrap = {"n0:1/dht"};
    averager::averager_options a;
    a.address = node.endpoint() + "/averager";
    a.target_group_size = 2;
    a.matchmaking_window = 500ms;
    a.round_timeout = 5s;
    node.on_start([d, a](runtime::sim::sim_node& nd) {
      auto h = nd.spawn("dht", dht::dht_actor, nd.resolver(), d);
      nd.spawn("averager", averager::averager_actor, h, nd.resolver(), a);
    });
    w.run_for(300ms);
  }
  w.run_for(1s);
  // Both start from the same theta (0) towards different targets: the collaboration's average
  // pulls both towards the mean target, 2.
  for (int i = 0; i < 2; ++i) {
    auto log = std::make_shared<toy_log>();
    log->theta = torch::zeros({6});
    logs.push_back(log);
    auto& node = w.node(static_cast<size_t>(i));
    node.spawn("toy", toy_peer, node.lookup("dht"), node.lookup("averager"),
               "toy" + std::to_string(i), torch::full({6}, i == 0 ? 1.0f : 3.0f), log);
  }
  w.run_for(30s);
  for (auto& log : logs) {
    CAPTURE(log->steps.size());
    CHECK(log->steps.size() >= 8);
    CHECK(log->downloads == 0);
  }
  REQUIRE(logs[0]->steps.size() == logs[1]->steps.size());
  // Every step but perhaps the first (a peer alone before it saw the other) was averaged.
  size_t averaged = 0;
  for (auto b : logs[0]->steps)
    averaged += b == collab::step_basis::averaged ? 1 : 0;
  MESSAGE(logs[0]->steps.size() << " steps, " << averaged << " averaged; theta[0] "
                                 << logs[0]->theta[0].item<double>());
  CHECK(averaged + 1 >= logs[0]->steps.size());
  CHECK(torch::equal(logs[0]->theta, logs[1]->theta));
  // Averaged steps pull towards the mean target (2), not a peer's own (1 or 3).
  CHECK(std::abs(logs[0]->theta[0].item<double>() - 2.0) < 0.5);
}

} // namespace starling::test::actors_collab_peer_test
