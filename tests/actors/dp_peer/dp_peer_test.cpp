// Data-parallel peers (actors/dp_peer) in simulation: the collaboration's parameters against a
// single process stepping on the same microbatches, newcomers, leavers, client and auxiliary
// peers, and determinism of a large modeled collaboration. Timing-dependent behaviour runs in
// virtual time, so every case is deterministic.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <caf/all.hpp>

#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/dp_peer/dp_peer.hpp"
#include "kernels/data/idx_source.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/swarm.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/run/dedloc.hpp"
#include "runtime/run/kinds.hpp"
#include "runtime/sim/world.hpp"

namespace starling::test::actors_dp_peer_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
namespace dp = starling::actors::dp_peer;

namespace {

/// Small and fast: a 784-32-10 MLP on 2048 synthetic images, 16-sample microbatches.
dedloc_role_options small_options() {
  dedloc_role_options o;
  o.backend = "torch";
  o.data.idx.dir = "/nonexistent/fashion-mnist"; // the synthetic stand-in, on every machine
  o.data.idx.synthetic_when_absent = true;
  o.data.idx.max_items = 2048;
  o.torch.model.width = 32;
  o.torch.model.layers = 1;
  o.torch.stream.microbatch = 16;
  o.peer.collab.progress.target_batch = 64;
  o.peer.compute_time = 100ms;
  o.peer.eval_every = 0;
  o.torch.optimizer.lr = 1e-2;
  o.averager.matchmaking_window = 1s;
  o.averager.round_timeout = 5s;
  o.peer.collab.round_timeout = 10;
  o.peer.collab.progress.record_lifetime = 20;
  return o;
}

/// One peer's update as its dp_step metric tells it.
struct step_record {
  double t = 0;
  std::string peer;
  uint64_t step = 0;
  uint64_t first = 0;
  uint64_t microbatches = 0;
  uint64_t samples = 0;
  bool averaged = false;
  double group = 0;
  double contributors = 0;
};

struct captured {
  std::vector<metric_record> all;
  /// At the end: each live peer's whole state and counters, by instance name.
  std::map<std::string, messages::stage_state> states;
  std::map<std::string, std::vector<uint64_t>> counters;

  std::vector<metric_record> of(const std::string& kind, const std::string& source = "") const {
    std::vector<metric_record> out;
    for (auto& m : all)
      if (m.kind == kind && (source.empty() || m.source == source))
        out.push_back(m);
    return out;
  }

  std::vector<step_record> steps(const std::string& source = "") const {
    std::vector<step_record> out;
    for (auto& m : of("dp_step", source)) {
      step_record r;
      r.t = m.t;
      r.peer = m.source;
      r.step = static_cast<uint64_t>(m.value("step"));
      r.first = static_cast<uint64_t>(m.value("first"));
      r.microbatches = static_cast<uint64_t>(m.value("microbatches"));
      r.samples = static_cast<uint64_t>(m.value("samples"));
      r.averaged = m.value("averaged") > 0;
      r.group = m.value("group");
      r.contributors = m.value("contributors");
      out.push_back(r);
    }
    return out;
  }
};

/// Keeps every metric and, at the end, asks every live instance of `role` for its state.
class capture_reporter : public reporter {
public:
  capture_reporter(std::shared_ptr<captured> out, std::string role)
      : out_(std::move(out)), role_(std::move(role)) {}

  void start(const run_info& info) override { info_ = info; }

  void on_metric(const metric_record& m) override { out_->all.push_back(m); }

  int finish(finish_context& ctx) override {
    auto& g = *info_.graph;
    auto& p = *info_.plan;
    for (auto& x : p.instances) {
      if (g.roles[x.role].name != role_ || !x.node)
        continue;
      auto addr = fmt::format("@{}/{}", *x.node, x.name);
      auto h = ask<caf::actor>(ctx, ctx.node().resolver(), 5s, resolve_atom::value, addr);
      if (!h || !std::get<0>(*h))
        continue;
      auto peer = std::get<0>(*h);
      if (auto st = ask<messages::stage_state>(ctx, peer, 10s, get_atom::value, state_atom::value))
        out_->states[x.name] = std::get<0>(*st);
      if (auto c = ask<std::vector<uint64_t>>(ctx, peer, 10s, status_atom::value))
        out_->counters[x.name] = std::get<0>(*c);
    }
    return 0;
  }

private:
  std::shared_ptr<captured> out_;
  std::string role_;
  run_info info_;
};

/// A graph of `peers` instances of `dedloc.peer` with `o`, capturing into `out`.
experiment_builder collaboration(const std::string& name, uint64_t seed,
                                 std::chrono::nanoseconds duration, size_t peers,
                                 const dedloc_role_options& o, std::shared_ptr<captured> out) {
  experiment_builder b{name};
  b.seed(seed).duration(duration);
  network_options net;
  net.defaults.latency = 5ms;
  net.defaults.bandwidth = 50e6;
  b.network(net);
  b.role("peers", "dedloc.peer", o).replicas(peers).unsupervised();
  b.reporter([out] { return std::make_unique<capture_reporter>(out, "peers"); });
  return b;
}

run_result run_sim(const experiment_builder& b) {
  auto reg = builtin_registry();
  auto g = b.build(reg, run_mode::sim);
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? "" : g.error().what));
  run_settings s;
  s.trace_messages = false;
  s.write_trace = false;
  return run_in_process(*g, reg, run_mode::sim, s);
}

/// The training data the role uses for `o` (the same synthetic stand-in).
std::shared_ptr<const kernels::data_source> train_source(const dedloc_role_options& o) {
  kernels::idx_source_options io;
  io.dir = o.data.idx.dir;
  io.max_items = o.data.idx.max_items;
  io.synthetic_when_absent = o.data.idx.synthetic_when_absent;
  auto s = kernels::idx_source::load(io);
  REQUIRE(s.ok());
  return *s;
}

/// A backend as instance `index` (generation 0) of the role builds it.
std::unique_ptr<dp::backend> peer_backend(const dedloc_role_options& o, uint64_t seed,
                                          size_t index) {
  dp::torch_backend_options to;
  to.model.inputs = 784;
  to.model.width = o.torch.model.width;
  to.model.layers = o.torch.model.layers;
  to.model.classes = 10;
  to.model.seed = seed;
  to.optimizer.kind = o.torch.optimizer.kind;
  to.optimizer.lr = o.torch.optimizer.lr;
  to.optimizer.momentum = o.torch.optimizer.momentum;
  to.optimizer.max_grad_norm = o.torch.optimizer.max_grad_norm;
  to.stream.seed = seed;
  to.stream.stream = static_cast<uint64_t>(index) * 1024;
  to.stream.microbatch = o.torch.stream.microbatch;
  to.eval_samples = 0;
  auto b = dp::make_torch_backend(to, train_source(o), nullptr);
  REQUIRE(b.ok());
  return std::move(*b);
}

size_t index_of(const std::string& name) {
  return static_cast<size_t>(std::stoul(name.substr(name.find('.') + 1)));
}

/// What a single process computes when every step averages the given peers' microbatches
/// (weights = samples), each peer's gradient taken on the common parameters: the parameters
/// after the steps of `records` (grouped by step, all averaged), as a flat vector.
torch::Tensor reference(const dedloc_role_options& o, uint64_t seed,
                        const std::vector<step_record>& records) {
  std::map<uint64_t, std::vector<step_record>> by_step;
  std::set<std::string> peers;
  for (auto& r : records) {
    by_step[r.step].push_back(r);
    peers.insert(r.peer);
  }
  std::map<std::string, std::unique_ptr<dp::backend>> models;
  for (auto& p : peers)
    models[p] = peer_backend(o, seed, index_of(p));
  for (auto& [step, rs] : by_step) {
    torch::Tensor sum;
    double weight = 0;
    for (auto& r : rs) {
      auto& m = *models[r.peer];
      for (uint64_t i = r.first; i < r.first + r.microbatches; ++i)
        REQUIRE(m.compute(i).ok());
      auto g = m.take();
      REQUIRE(g.samples == r.samples);
      auto w = static_cast<double>(g.samples);
      sum = sum.defined() ? sum + g.mean.to(torch::kDouble) * w : g.mean.to(torch::kDouble) * w;
      weight += w;
    }
    auto mean = (sum / weight).to(torch::kFloat);
    for (auto& [p, m] : models)
      REQUIRE(m->apply(mean).ok());
  }
  auto st = models.begin()->second->export_state(0);
  REQUIRE(st.ok());
  return st->params.tensor;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

} // namespace

TEST_CASE("one peer without churn equals a single process stepping on the same global batches") {
  auto o = small_options();
  auto out = std::make_shared<captured>();
  auto res = run_sim(collaboration("dp-one", 11, 30s, 1, o, out));
  CHECK(res.exit_code == 0);
  auto steps = out->steps("peers.0");
  REQUIRE(steps.size() >= 4);
  for (auto& r : steps) {
    CHECK_FALSE(r.averaged); // alone: it steps on its own gradient
    CHECK(r.samples >= o.peer.collab.progress.target_batch);
  }
  REQUIRE(out->states.count("peers.0") == 1);
  auto& st = out->states["peers.0"];
  CHECK(st.steps == steps.size());
  auto ref = reference(o, 11, steps);
  auto d = max_diff(st.params.tensor, ref);
  MESSAGE("one peer, ", steps.size(), " steps: max |param - single process| = ", d);
  CHECK(d <= 1e-6);
}

TEST_CASE("with persistent rounds a step's group re-forms at once and every step is averaged") {
  // Four peers of different speeds; the same run with and without dedloc.persistent_rounds.
  // Without it every step's round waits out the matchmaking window (1 s) after the step's
  // target is reached; with it, rounds after the first re-form the last step's group as soon as
  // its members are back, so the same virtual time holds more global steps.
  auto run = [](bool persistent) {
    auto o = small_options();
    o.speeds = {1.0, 0.8, 0.6, 0.5};
    o.averager.family_groups = persistent;
    auto out = std::make_shared<captured>();
    auto res =
        run_sim(collaboration(persistent ? "dp-persist-on" : "dp-persist-off", 12, 20s, 4, o, out));
    CHECK(res.exit_code == 0);
    return out;
  };
  auto off = run(false);
  auto on = run(true);
  auto rounds = [](const captured& c) {
    std::vector<double> r;
    for (auto& m : c.of("dp_step", "peers.0"))
      r.push_back(m.value("round_s"));
    return r;
  };
  auto r_off = rounds(*off), r_on = rounds(*on);
  REQUIRE(r_off.size() >= 3);
  REQUIRE(r_on.size() >= 3);
  for (size_t i = 1; i < r_off.size(); ++i)
    CHECK(r_off[i] >= 1.0); // the window
  for (size_t i = 1; i < r_on.size(); ++i) {
    CAPTURE(i);
    CHECK(r_on[i] < 0.5);
  }
  CHECK(r_on.size() > r_off.size() + 3);
  for (auto& r : on->steps()) {
    CAPTURE(r.peer);
    CAPTURE(r.step);
    CHECK(r.averaged);
    CHECK(r.contributors == 4);
  }
  MESSAGE("steps of peers.0 in 20 virtual s: ", r_off.size(), " without, ", r_on.size(),
          " with persistent rounds");
}

TEST_CASE("with delayed updates peers compute through the rounds and still end as one model") {
  // Slow links (1 MB/s): a round of the ~100 KB model takes longer than the peers need to
  // compute a step's target batch. Paused for every round, the peers idle; with
  // dedloc.delay_updates they compute the next step's microbatches meanwhile (on parameters one
  // step old) and apply each averaged gradient when it arrives.
  auto run = [](bool delayed) {
    auto o = small_options();
    o.speeds = {1.0, 0.8, 0.6, 0.5};
    o.peer.collab.delay_updates = delayed;
    auto out = std::make_shared<captured>();
    auto b = collaboration(delayed ? "dp-delay-on" : "dp-delay-off", 15, 20s, 4, o, out);
    network_options net;
    net.defaults.latency = 5ms;
    net.defaults.bandwidth = 1e6;
    b.network(net);
    auto res = run_sim(b);
    CHECK(res.exit_code == 0);
    return out;
  };
  auto off = run(false);
  auto on = run(true);
  auto computed = [](const captured& c) {
    uint64_t n = 0;
    for (auto& [name, k] : c.counters)
      n += k[dp::st_microbatches];
    return n;
  };
  REQUIRE(on->counters.size() == 4);
  REQUIRE(off->counters.size() == 4);
  MESSAGE("microbatches in 20 virtual s: ", computed(*off), " pausing for rounds, ", computed(*on),
          " with delayed updates");
  CHECK(computed(*on) > computed(*off) * 3 / 2);
  auto steps = on->steps();
  REQUIRE(steps.size() >= 12);
  for (auto& r : steps) {
    CAPTURE(r.peer);
    CAPTURE(r.step);
    CHECK(r.averaged);
    CHECK(r.contributors == 4);
  }
  // Peers at one step hold one state: each applied the same averaged gradients in order.
  std::map<uint64_t, std::vector<const messages::stage_state*>> by_step;
  for (auto& [name, st] : on->states)
    by_step[st.steps].push_back(&st);
  size_t same = 0;
  for (auto& [step, sts] : by_step) {
    CAPTURE(step);
    for (auto* st : sts)
      CHECK(max_diff(st->params.tensor, sts.front()->params.tensor) == 0);
    same = std::max(same, sts.size());
  }
  CHECK(same >= 2);
  // Exactly once: each step's microbatches follow the last step's, and every sample reported is
  // in one place (the round in flight included).
  std::map<std::string, uint64_t> next;
  for (auto& r : steps) {
    CAPTURE(r.peer);
    CHECK(r.first == next[r.peer]);
    next[r.peer] = r.first + r.microbatches;
  }
  for (auto& [name, c] : on->counters) {
    CAPTURE(name);
    CHECK(c[dp::st_samples_reported] == c[dp::st_samples_averaged] + c[dp::st_samples_alone] +
                                            c[dp::st_samples_dropped] + c[dp::st_pending] +
                                            c[dp::st_in_flight]);
  }
}

TEST_CASE("four peers average every step and match a single process within the codec's error") {
  auto o = small_options();
  // SGD: Adam's first steps turn fp32 rounding of near-zero averages into whole steps of +-lr.
  o.torch.optimizer.kind = "sgd";
  o.torch.optimizer.lr = 0.1;
  o.speeds = {1.0, 0.8, 0.6, 0.5};
  auto out = std::make_shared<captured>();
  auto res = run_sim(collaboration("dp-four", 12, 40s, 4, o, out));
  CHECK(res.exit_code == 0);
  auto steps = out->steps();
  std::map<uint64_t, size_t> per_step;
  for (auto& r : steps) {
    CHECK(r.averaged);
    CHECK(r.contributors == 4);
    per_step[r.step]++;
  }
  REQUIRE(per_step.size() >= 3);
  // Only complete steps (every peer reported it) go into the reference.
  uint64_t last = 0;
  for (auto& [s, n] : per_step)
    if (n == 4)
      last = s;
    else
      break;
  std::vector<step_record> used;
  for (auto& r : steps)
    if (r.step <= last)
      used.push_back(r);
  auto ref = reference(o, 12, used);
  REQUIRE(out->states.size() == 4);
  for (auto& [name, st] : out->states) {
    CAPTURE(name);
    if (st.steps != last + 1)
      continue; // a step further: compared by the others
    auto d = max_diff(st.params.tensor, ref);
    MESSAGE(name, " after ", st.steps, " steps: max |param - single process| = ", d);
    CHECK(d <= 1e-5);
  }
  // Peers that stand at one step hold one state.
  auto& a = out->states["peers.0"];
  for (auto& [name, st] : out->states)
    if (st.steps == a.steps)
      CHECK(max_diff(st.params.tensor, a.params.tensor) == 0);
}

TEST_CASE("under churn a peer that stepped alone takes the collaboration's state again") {
  // Newcomers join every 1.7 s while peers leave: with persistent rounds a newcomer's first
  // round often misses its step's group (it re-formed before the newcomer asked) and the
  // newcomer steps alone. It then downloads the state of the peers at its step that took the
  // averaged update, so at the end every live peer at one step holds one model.
  auto o = small_options();
  o.speeds = {1.0, 0.8, 0.6, 0.45, 0.3};
  o.peer.collab.progress.target_batch = 256;
  o.peer.compute_time = 40ms;
  auto out = std::make_shared<captured>();
  auto b = collaboration("dp-churn", 16, 40s, 6, o, out);
  network_options net;
  net.defaults.latency = 20ms;
  net.defaults.bandwidth = 12.5e6;
  b.network(net);
  for (int i = 0; i < 10; ++i)
    b.join("peers", std::chrono::milliseconds(6000 + 1700 * i));
  for (size_t i = 0; i < 8; ++i)
    b.leave("peers", i, std::chrono::milliseconds(7000 + 2300 * static_cast<int64_t>(i)));
  run_sim(b);
  std::set<std::string> lone;
  for (auto& r : out->steps())
    if (!r.averaged)
      lone.insert(r.peer);
  MESSAGE(lone.size(), " peers stepped alone at least once");
  CHECK(!lone.empty()); // the case this test is about happened
  std::map<uint64_t, std::vector<std::string>> by_step;
  for (auto& [name, st] : out->states)
    by_step[st.steps].push_back(name);
  size_t compared = 0;
  for (auto& [step, names] : by_step) {
    CAPTURE(step);
    for (auto& n : names) {
      CAPTURE(n);
      CHECK(max_diff(out->states[n].params.tensor, out->states[names.front()].params.tensor) ==
            0);
      compared++;
    }
  }
  CHECK(compared >= 4);
  // A peer that stepped alone and is still live ends averaging with the others.
  for (auto& p : lone) {
    if (out->states.count(p) == 0)
      continue;
    auto mine = out->steps(p);
    REQUIRE(!mine.empty());
    CAPTURE(p);
    CHECK(mine.back().averaged);
  }
}

TEST_CASE("a newcomer downloads the state mid-run and contributes to the next step") {
  auto o = small_options();
  bool persistent = true;
  SUBCASE("persistent rounds (the default)") {}
  SUBCASE("a matchmaking window per step") {
    persistent = false;
  }
  SUBCASE("lamb8: the state travels as 8-bit codes and scales") {
    o.torch.optimizer.kind = "lamb8";
  }
  CAPTURE(persistent);
  CAPTURE(o.torch.optimizer.kind);
  o.averager.family_groups = persistent;
  auto out = std::make_shared<captured>();
  auto b = collaboration("dp-newcomer", 13, 45s, 3, o, out);
  b.join("peers", 15s);
  run_sim(b);
  auto downloads = out->of("dp_download", "peers.3");
  REQUIRE(!downloads.empty());
  CHECK(downloads.front().value("ok") == 1);
  auto mine = out->steps("peers.3");
  REQUIRE(!mine.empty());
  // The state it loaded last before its first update. With persistent rounds the step's group
  // may have re-formed before the newcomer asked to join it: it then loads the next step's
  // state once more and is in the group from the step after.
  const metric_record* last = nullptr;
  for (auto& d : downloads)
    if (d.t <= mine.front().t)
      last = &d;
  REQUIRE(last != nullptr);
  CHECK(last->value("ok") == 1);
  auto loaded = static_cast<uint64_t>(last->value("step"));
  CHECK(loaded >= 1);
  CHECK(downloads.size() <= (persistent ? 2u : 1u));
  CHECK(mine.front().step == loaded); // the next step after the state it loaded
  // It takes that step with the others even when it had no time for samples of its own yet.
  CHECK(mine.front().averaged);
  CHECK(mine.front().contributors >= 2);
  // Its first step with samples of its own is averaged, and the others saw them.
  auto first =
      std::find_if(mine.begin(), mine.end(), [](const step_record& r) { return r.samples > 0; });
  REQUIRE(first != mine.end());
  CHECK(first->averaged);
  CHECK(first->contributors >= 2);
  bool counted = false;
  for (auto& r : out->steps("peers.0"))
    if (r.step == first->step)
      counted = r.contributors == 4;
  CHECK(counted);
  REQUIRE(out->states.count("peers.3") == 1);
  REQUIRE(out->states.count("peers.0") == 1);
  if (out->states["peers.3"].steps == out->states["peers.0"].steps)
    CHECK(max_diff(out->states["peers.3"].params.tensor, out->states["peers.0"].params.tensor) ==
          0);
  // A lamb8 donor's state holds codes and scales, not fp32 moments.
  auto& donor = out->states["peers.0"];
  CHECK(donor.packed_moments.empty() == (o.torch.optimizer.kind != "lamb8"));
  CHECK(donor.moments.tensor.defined() == (o.torch.optimizer.kind != "lamb8"));
}

TEST_CASE("a peer killed mid-round does not block the others past the deadline and no sample is "
          "counted twice") {
  auto o = small_options();
  // A dry run finds a time when peers.3 is inside a round (same seed, same plan until then).
  auto dry = std::make_shared<captured>();
  run_sim(collaboration("dp-leaver", 14, 20s, 4, o, dry));
  auto rounds = dry->of("dp_step", "peers.3");
  REQUIRE(rounds.size() >= 3);
  auto& r2 = rounds[2];
  auto mid = r2.t - r2.value("round_s") / 2;
  CAPTURE(mid);
  auto out = std::make_shared<captured>();
  auto b = collaboration("dp-leaver", 14, 50s, 4, o, out);
  b.kill("peers", 3,
         std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(mid)),
         restart_after{std::nullopt, true});
  b.leave("peers", 2, 35s);
  run_sim(b);
  // The survivors keep stepping: none waits longer than the round deadline plus a window.
  auto deadline = o.peer.collab.round_timeout +
                  std::chrono::duration<double>(o.averager.matchmaking_window).count() + 2;
  for (auto who : {"peers.0", "peers.1"}) {
    CAPTURE(who);
    auto s = out->steps(who);
    REQUIRE(s.size() >= 5);
    double prev = mid;
    size_t after = 0;
    for (auto& r : s) {
      if (r.t < mid)
        continue;
      CHECK(r.t - prev <= deadline);
      prev = r.t;
      after++;
    }
    CHECK(after >= 3);
  }
  // The leaver withdrew its record.
  CHECK(out->of("dp_leave", "peers.2").size() == 1);
  // Exactly once: every peer's microbatches reach at most one update or drop.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  for (auto& r : out->steps())
    if (r.microbatches > 0)
      ranges[r.peer].emplace_back(r.first, r.first + r.microbatches);
  for (auto& m : out->of("dp_dropped"))
    ranges[m.source].emplace_back(static_cast<uint64_t>(m.value("first")),
                                  static_cast<uint64_t>(m.value("last")) + 1);
  for (auto& [peer, rs] : ranges) {
    CAPTURE(peer);
    std::sort(rs.begin(), rs.end());
    for (size_t i = 1; i < rs.size(); ++i)
      CHECK(rs[i].first >= rs[i - 1].second);
  }
  // Every sample a live peer reported is in exactly one place.
  for (auto& [name, c] : out->counters) {
    CAPTURE(name);
    CHECK(c[dp::st_samples_reported] == c[dp::st_samples_averaged] + c[dp::st_samples_alone] +
                                            c[dp::st_samples_dropped] + c[dp::st_pending] +
                                            c[dp::st_in_flight]);
  }
}

TEST_CASE("the survivors of a matchmaking leader that leaves average together and stay equal") {
  // Churn (examples/torchscript/dedloc.yaml with churn 1.0): peers.0, the smallest address and
  // so everyone's matchmaking leader, left inside a round's matchmaking window. Its followers
  // waited for a group until the window and the grace ended, then each stepped alone on its own
  // gradient: no averaged step for a while, and parameters that stayed apart for good.
  auto o = small_options();
  bool persistent = true;
  SUBCASE("persistent rounds (the default): it leaves while its group re-forms") {}
  SUBCASE("a matchmaking window per step") {
    persistent = false;
  }
  CAPTURE(persistent);
  o.averager.family_groups = persistent;
  // A dry run finds when peers.0 matches for its third round (same seed and plan until then).
  auto dry = std::make_shared<captured>();
  run_sim(collaboration("dp-leader-leaves", 15, 12s, 3, o, dry));
  auto rounds = dry->of("dp_step", "peers.0");
  REQUIRE(rounds.size() >= 3);
  auto& r = rounds[2];
  auto step = static_cast<uint64_t>(r.value("step"));
  // Inside its matchmaking window: late enough that the others joined it, before it closes.
  auto at = r.t - r.value("round_s") +
            0.6 * std::chrono::duration<double>(o.averager.matchmaking_window).count();
  CAPTURE(at);
  auto out = std::make_shared<captured>();
  auto ns = [](double s) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
  };
  auto b = collaboration("dp-leader-leaves", 15, ns(at + 8), 3, o, out);
  b.leave("peers", 0, ns(at));
  run_sim(b);
  REQUIRE(out->of("dp_leave", "peers.0").size() == 1);
  for (auto who : {"peers.1", "peers.2"}) {
    CAPTURE(who);
    auto s = out->steps(who);
    // The first update after the leave: `step` itself when the leader left inside its
    // matchmaking window; with persistent rounds the group of a step re-forms at once, so the
    // leave can fall after it formed (that step's round then still has three members).
    auto it = std::find_if(s.begin(), s.end(), [&](const step_record& x) {
      return x.step >= step && x.group == 2;
    });
    REQUIRE(it != s.end());
    if (!persistent)
      CHECK(it->step == step);
    CHECK(it->averaged);
    CHECK(it->t - at <= std::chrono::duration<double>(o.averager.matchmaking_window).count() + 0.5);
    // No step of its own from then on: the two stay one model.
    size_t later = 0;
    for (; it != s.end(); ++it, ++later)
      CHECK(it->averaged);
    CHECK(later >= 3);
  }
  REQUIRE(out->states.count("peers.1") == 1);
  REQUIRE(out->states.count("peers.2") == 1);
  auto& s1 = out->states["peers.1"];
  auto& s2 = out->states["peers.2"];
  if (s1.steps == s2.steps) // (the run may end between their updates of one step)
    CHECK(max_diff(s1.params.tensor, s2.params.tensor) == 0);
}

namespace {

/// `(resolve_atom, address)` through `inner`, logging every address asked for.
caf::behavior counting_resolver(caf::event_based_actor* self, caf::actor inner,
                                std::shared_ptr<std::vector<std::string>> log) {
  return {
      [=](resolve_atom, const std::string& a) -> caf::result<caf::actor> {
        log->push_back(a);
        auto rp = self->make_response_promise<caf::actor>();
        self->request(inner, caf::infinite, resolve_atom::value, a)
            .then([=](caf::actor& x) mutable { rp.deliver(x); },
                  [=](caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
  };
}

caf::behavior metric_sink(caf::event_based_actor*, sim::world* w, std::shared_ptr<captured> out) {
  return {
      [=](messages::metric_event& e) {
        metric_record m;
        m.t = std::chrono::duration<double>(w->elapsed()).count();
        m.source = e.source;
        m.kind = e.kind;
        m.values = e.values;
        m.labels = e.labels;
        out->all.push_back(m);
      },
  };
}

} // namespace

TEST_CASE("client-mode contributions are in the average, auxiliary ones are not, and nobody "
          "connects to a client") {
  auto o = small_options();
  o.torch.optimizer.kind = "sgd";
  o.torch.optimizer.lr = 0.1;
  const uint64_t seed = 15;
  sim::world_options wo;
  wo.seed = seed;
  wo.network.defaults.latency = 5ms;
  wo.network.defaults.bandwidth = 50e6;
  wo.trace_messages = false;
  sim::world w{wo};
  // Nodes 0-2 full, node 3 a client (no DHT node of its own: it uses node 0's over the link it
  // opens), node 4 auxiliary.
  const int client = 3, aux = 4;
  auto out = std::make_shared<captured>();
  auto sink = w.system().spawn(metric_sink, &w, out);
  std::vector<std::shared_ptr<std::vector<std::string>>> asked;
  std::vector<caf::actor> peers;
  for (int i = 0; i < 5; ++i) {
    auto& n = w.add_node(fmt::format("node{}", i));
    auto log = std::make_shared<std::vector<std::string>>();
    asked.push_back(log);
    auto resolver = n.spawn("counting-resolver", counting_resolver, n.resolver(), log);
    caf::actor dht;
    if (i == client) {
      // Resolved like any remote actor: the client's node says hello to node 0 first.
      auto r = w.resolve(i, "node0:1/dht");
      REQUIRE(r);
      dht = *r;
    } else {
      actors::dht::dht_options d;
      d.address = n.endpoint() + "/dht";
      d.id = actors::dht::identity::from_seed(seed * 100 + static_cast<uint64_t>(i));
      if (i > 0)
        d.bootstrap = {"node0:1/dht"};
      dht = n.spawn("dht", actors::dht::dht_actor, resolver, d);
    }
    actors::averager::averager_options ao;
    ao.address = n.endpoint() + "/avg";
    ao.key_prefix = "t/avg/";
    ao.bandwidth = i == client ? 0.0 : 1.0;
    ao.auxiliary = i == aux;
    ao.matchmaking_window = o.averager.matchmaking_window;
    ao.poll_interval = o.averager.matchmaking_window / 8;
    ao.round_timeout = o.averager.round_timeout;
    auto avg = n.spawn("avg", actors::averager::averager_actor, dht, resolver, ao);
    dp::dp_peer_options po;
    po.address = n.endpoint() + "/peer";
    po.name = fmt::format("peers.{}", i);
    po.key_prefix = "t/dp";
    po.compute_time = o.peer.compute_time;
    po.collab.progress.target_batch = o.peer.collab.progress.target_batch;
    po.collab.progress.record_lifetime = 20;
    po.collab.progress.max_refresh = 10;
    po.collab.round_timeout = 10;
    // A read sent while the node's DHT still bootstraps goes unanswered: ask again soon.
    po.collab.read_timeout = 1;
    po.collab.mode = i == client ? actors::collab::peer_mode::client
                     : i == aux  ? actors::collab::peer_mode::auxiliary
                                 : actors::collab::peer_mode::full;
    REQUIRE(dp::validate(po).ok());
    std::shared_ptr<dp::backend> model = peer_backend(o, seed, static_cast<size_t>(i));
    auto peer = dp::spawn_dp_peer(w.system(), {dht, avg, resolver, sink}, model, po);
    n.adopt("peer", peer);
    peers.push_back(peer);
  }
  w.run_for(30s);
  // Nobody resolved an address of the client's node: every link to it is one it opened.
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    if (i == client)
      continue;
    for (auto& a : *asked[static_cast<size_t>(i)]) {
      CAPTURE(a);
      CHECK(a.rfind("node3:1", 0) != 0);
      CHECK(a.rfind("@3/", 0) != 0);
    }
  }
  CHECK(!asked[client]->empty()); // the client does resolve the others
  // Every full peer's steps averaged the client's contribution and not the auxiliary peer's:
  // 4 contributors in a group of 5.
  auto steps = out->steps("peers.0");
  REQUIRE(steps.size() >= 3);
  for (auto& r : steps) {
    CAPTURE(r.step);
    CHECK(r.averaged);
    // The auxiliary peer's first read can go unanswered while its DHT node still bootstraps
    // (asked again after read_timeout): from step 1 on it reduces in every group.
    if (r.step > 0)
      CHECK(r.group == 5);
    CHECK(r.group >= 4);
    CHECK(r.contributors == 4);
  }
  // Numerically: the parameters are a single process's over the full peers' and the client's
  // microbatches (the auxiliary peer computes nothing and weighs 0).
  CHECK(out->steps("peers.4").empty());
  std::vector<step_record> used;
  auto last = steps[1].step;
  for (auto& r : out->steps())
    if (r.step <= last)
      used.push_back(r);
  std::set<std::string> who;
  for (auto& r : used)
    who.insert(r.peer);
  CHECK((who == std::set<std::string>{"peers.0", "peers.1", "peers.2", "peers.3"}));
  auto ref = reference(o, seed, used);
  // Ask peers.0 and the client for their state once they stand at step last + 1: run a probe.
  auto got = std::make_shared<std::map<int, messages::stage_state>>();
  auto probe = w.system().spawn([=](caf::event_based_actor* self) -> caf::behavior {
    for (int i : {0, client})
      self->request(peers[static_cast<size_t>(i)], 10s, get_atom::value, state_atom::value)
          .then([=](messages::stage_state& st) { (*got)[i] = st; }, [](caf::error&) {});
    return {[](stop_atom) {}};
  });
  w.run_for(1s);
  caf::anon_send_exit(probe, caf::exit_reason::kill);
  caf::anon_send_exit(sink, caf::exit_reason::kill);
  REQUIRE(got->size() == 2);
  CHECK(max_diff((*got)[0].params.tensor, (*got)[client].params.tensor) == 0);
  // The peers went on past `last`: compare with the reference of every complete step they took.
  std::vector<step_record> all_used;
  std::map<uint64_t, size_t> per_step;
  for (auto& r : out->steps())
    per_step[r.step]++;
  for (auto& r : out->steps())
    if (per_step[r.step] == 4 && r.step < (*got)[0].steps)
      all_used.push_back(r);
  auto ref_all = reference(o, seed, all_used);
  auto d = max_diff((*got)[0].params.tensor, ref_all);
  MESSAGE("3 full + 1 client peer, ", (*got)[0].steps,
          " steps: max |param - single process| = ", d);
  CHECK(d <= 1e-5);
  (void)ref;
}

TEST_CASE(
    "a 16-peer modeled collaboration with churn in virtual time is deterministic for a seed") {
  dedloc_role_options o;
  o.backend = "modeled";
  o.modeled.numel = 20'000;
  o.torch.stream.microbatch = 32;
  o.peer.collab.progress.target_batch = 512;
  o.peer.compute_time = 200ms;
  o.speeds = {1.0, 0.75, 0.5, 0.25};
  o.cycle = 16;
  o.clients = 2;
  o.peer.eval_every = 0;
  auto run = [&](uint64_t seed) {
    auto out = std::make_shared<captured>();
    auto b = collaboration("dp-16", seed, 30s, 16, o, out);
    b.graph().nodes = 4;
    churn_spec churn;
    churn.role = "peers";
    churn.per_minute = 0.2;
    b.churn(churn);
    auto reg = builtin_registry();
    auto g = b.build(reg, run_mode::sim);
    REQUIRE(g.ok());
    run_settings s;
    s.trace_messages = true;
    s.write_trace = false;
    auto res = run_in_process(*g, reg, run_mode::sim, s);
    return std::make_pair(res, out);
  };
  auto [a, out_a] = run(21);
  auto [b, out_b] = run(21);
  CHECK(a.trace_digest == b.trace_digest);
  CHECK(a.trace_events == b.trace_events);
  CHECK(out_a->all.size() == out_b->all.size());
  auto steps = out_a->steps();
  REQUIRE(!steps.empty());
  uint64_t top = 0;
  for (auto& r : steps)
    top = std::max(top, r.step);
  MESSAGE("16 modeled peers, 30 s: ", top + 1, " global steps, ", out_a->all.size(),
          " metrics, trace digest ", a.trace_digest);
  CHECK(top >= 2);
  CHECK(!out_a->of("dp_leave").empty());
}

TEST_CASE("DiLoCo peers exchange Top-k pseudo-gradients through one reducer and share the outer "
          "state, at over 100 times fewer bytes than fp32") {
  auto o = small_options();
  o.peer.algo = dp::algorithm::diloco;
  o.peer.collab.progress.target_batch = 256;
  o.peer.inner_batch = 32;
  o.peer.diloco.codec = kernels::codec_id::topk;
  o.peer.diloco.codec_params.ratio = 0.005;
  o.peer.diloco.error_feedback = true;
  o.peer.diloco.outer.momentum = 0;
  o.peer.diloco.outer.nesterov = false;
  o.cycle = 3;
  o.clients = 1; // peers.2 is a client: it never reduces
  auto out = std::make_shared<captured>();
  run_sim(collaboration("dp-diloco", 16, 40s, 3, o, out));
  auto steps = out->steps();
  std::map<uint64_t, size_t> per_step;
  for (auto& r : steps) {
    CHECK(r.averaged);
    CHECK(r.contributors == 3);
    per_step[r.step]++;
  }
  REQUIRE(per_step.size() >= 3);
  // Every peer at the same outer step holds the same start parameters (the same bytes applied).
  REQUIRE(out->states.size() == 3);
  auto& a = out->states["peers.0"];
  for (auto& [name, st] : out->states)
    if (st.steps == a.steps)
      CHECK(max_diff(st.params.tensor, a.params.tensor) == 0);
  // Bytes per peer and outer step, both directions, against fp32's 4 bytes per parameter.
  auto numel = static_cast<double>(a.params.tensor.numel());
  double sent = 0, fp32_all = 0;
  for (auto& [name, c] : out->counters) {
    CAPTURE(name);
    auto rounds = static_cast<double>(out->steps(name).size());
    REQUIRE(rounds > 0);
    auto fp32 = 4 * numel * rounds;
    sent += static_cast<double>(c[dp::st_bytes_sent]);
    fp32_all += fp32;
    CHECK(c[dp::st_bytes_received] > 0);
    CHECK(c[dp::st_bytes_sent] > 0);
    // The averager's Top-k rounds: the full peers each reduce a part and send its result to
    // both others; peers.2, a client, reduces nothing and only sends its own contribution.
    if (name == "peers.2")
      CHECK(static_cast<double>(c[dp::st_bytes_sent]) * 100 < fp32);
    CHECK(static_cast<double>(c[dp::st_bytes_received]) * 100 < 2 * fp32);
    MESSAGE(name, ": ", c[dp::st_bytes_sent], " B sent, ", c[dp::st_bytes_received],
            " B received over ", rounds, " outer steps (fp32: ", fp32, " B each way)");
  }
  // All peers together send over 100 times fewer bytes than fp32 contributions would.
  CHECK(sent * 100 < fp32_all);
}

namespace {

/// The largest parameter distance between two live peers at the same step (and how many such
/// pairs there were).
std::pair<double, size_t> spread_at_same_step(const captured& c) {
  double worst = 0;
  size_t pairs = 0;
  for (auto a = c.states.begin(); a != c.states.end(); ++a)
    for (auto b = std::next(a); b != c.states.end(); ++b)
      if (a->second.steps == b->second.steps) {
        worst = std::max(worst, max_diff(a->second.params.tensor, b->second.params.tensor));
        pairs++;
      }
  return {worst, pairs};
}

} // namespace

TEST_CASE("after a lone step the peers average their state and end together again") {
  // A partition cuts the three peers apart for 4 s: rounds in it find no partner, peers.1 and
  // peers.2 step alone on their own gradients (peers.0 falls behind and later downloads), and
  // their parameters part. Without a resync every later averaged update keeps them apart; with
  // it, the update after the lone steps is followed by a state round (here the first one still
  // fails and the retry after the next update loads) that brings them back to one model.
  // (With a matchmaking window per step, where the contrast shows; with persistent rounds, the
  // default, the last run below.)
  auto o = small_options();
  o.averager.family_groups = false;
  auto run = [&](bool resync, bool persistent = false) {
    auto x = o;
    x.peer.collab.resync_after_lone_step = resync;
    x.averager.family_groups = persistent;
    auto out = std::make_shared<captured>();
    auto b = collaboration(resync ? "dp-resync-on" : "dp-resync-off", 16, 24s, 3, x, out);
    b.partition({{0}, {1}, {2}}, 5s, 9s);
    run_sim(b);
    return out;
  };
  auto on = run(true);
  auto off = run(false);
  auto fast = run(true, true);
  for (auto* c : {on.get(), off.get(), fast.get()}) {
    // The partition did its job: lone updates in both runs, averaged ones after it.
    auto s = c->steps();
    CHECK(std::count_if(s.begin(), s.end(), [](const step_record& r) { return !r.averaged; }) >= 3);
    CHECK(std::count_if(s.begin(), s.end(),
                        [](const step_record& r) { return r.averaged && r.t > 10; }) >= 3);
  }
  auto resyncs = [](const captured& c) {
    size_t loaded = 0;
    for (auto& m : c.of("dp_state_round"))
      if (m.value("resync") > 0 && m.value("loaded") > 0)
        loaded++;
    return loaded;
  };
  CHECK(resyncs(*on) >= 2); // at least two peers averaged their states together
  CHECK(off->of("dp_state_round").empty());
  auto [d_on, pairs_on] = spread_at_same_step(*on);
  auto [d_off, pairs_off] = spread_at_same_step(*off);
  CAPTURE(d_on);
  CAPTURE(d_off);
  REQUIRE(pairs_on >= 1);
  REQUIRE(pairs_off >= 1);
  constexpr double bound = 1e-6;
  CHECK(d_on < bound);
  CHECK(d_off > bound);
  // Persistent rounds: the peers' DHT nodes see each other again at their first read after the
  // partition (they join again before they look up), and the peers end as one model.
  auto [d_fast, pairs_fast] = spread_at_same_step(*fast);
  CAPTURE(d_fast);
  REQUIRE(pairs_fast >= 1);
  CHECK(d_fast < bound);
}

TEST_CASE("the torch backend's MLP takes its input and class counts from the data") {
  // Images of another shape than Fashion-MNIST's: 14x14 pixels, 5 classes.
  auto images = kernels::idx_source::make(
      std::make_shared<const kernels::image_set>(kernels::make_synthetic_images(64, 14, 5, 1)),
      true);
  REQUIRE(images.ok());
  dp::torch_backend_options to;
  to.model.width = 8;
  to.model.layers = 1;
  to.stream.microbatch = 4;
  to.eval_samples = 16;
  auto sized = [&](int64_t inputs, int64_t classes) {
    auto o = to;
    o.model.inputs = inputs;
    o.model.classes = classes;
    auto b = dp::make_torch_backend(o, *images, *images);
    REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().what));
    return std::move(*b);
  };
  auto from_data = sized(0, 0);
  CHECK(from_data->numel() == sized(196, 5)->numel());
  CHECK(from_data->numel() != sized(784, 10)->numel());
  REQUIRE(from_data->compute(0).ok());
  auto e = from_data->evaluate();
  REQUIRE(e);
  CHECK(e->samples == 16);
}

} // namespace starling::test::actors_dp_peer_test
