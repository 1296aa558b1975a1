#include "actors/collab/grad_accumulator.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "actors/collab/coordinator.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/mlp.hpp"

namespace starling::test::actors_grad_accumulator_test {

using namespace starling::actors::collab;
using namespace starling::kernels;

namespace {

struct batch {
  torch::Tensor x, y;
};

/// The global batches of `steps` steps of `size` samples each, seeded.
std::vector<batch> global_batches(const mlp_config& cfg, int steps, int64_t size) {
  auto gen = seeded_generator(42);
  std::vector<batch> out;
  for (int i = 0; i < steps; ++i)
    out.push_back({torch::randn({size, cfg.inputs}, gen),
                   torch::randint(0, cfg.classes, {size}, gen, torch::kLong)});
  return out;
}

optimizer_options optim(const std::string& kind) {
  optimizer_options o;
  o.kind = kind;
  o.lr = kind == "lamb" || kind == "lamb8" ? 2e-2 : kind == "sgd" ? 5e-2 : 1e-2;
  o.momentum = kind == "sgd" ? 0.9 : 0.0;
  o.max_grad_norm = 0.5; // small enough to clip now and then
  return o;
}

/// A one-peer collaboration carried out as a thin actor would: feed the coordinator events,
/// carry out its effects with the accumulator. A peer that never saw another steps alone; the
/// averager of a single peer would return the peer's own gradient.
struct solo_peer {
  coordinator core;
  grad_accumulator acc;
  std::map<uint64_t, taken_gradient> rounds;
  seconds wake = 1e18;
  std::vector<uint64_t> round_samples;

  solo_peer(coordinator_options o, grad_accumulator a) : core("solo", o), acc(std::move(a)) {}

  void run(std::vector<effect> es, seconds now) {
    while (!es.empty()) {
      std::vector<effect> next;
      for (auto& e : es) {
        std::vector<effect> more;
        if (std::holds_alternative<read_progress>(e)) {
          more = core.progress_read({}, now);
        } else if (auto* w = std::get_if<wake_at>(&e)) {
          wake = w->at;
        } else if (auto* r = std::get_if<start_round>(&e)) {
          auto g = acc.take();
          REQUIRE(g.samples == r->samples);
          round_samples.push_back(g.samples);
          rounds[r->id] = g;
          more = core.round_done(r->id, now);
        } else if (auto* sa = std::get_if<step_alone>(&e)) {
          // Nobody else ever showed up: the core steps without a round.
          auto g = acc.take();
          REQUIRE(g.samples == sa->samples);
          round_samples.push_back(g.samples);
          REQUIRE(acc.apply(g.mean).ok());
        } else if (auto* a = std::get_if<apply_averaged>(&e)) {
          REQUIRE(acc.apply(rounds.at(a->id).mean).ok());
          rounds.erase(a->id);
        }
        next.insert(next.end(), more.begin(), more.end());
      }
      es = std::move(next);
    }
  }
};

} // namespace

TEST_CASE("with one peer and no churn, the collaborative result equals a single-process run "
          "with the same global batch") {
  mlp_config cfg;
  constexpr int steps = 6;
  constexpr int64_t global = 32, micro = 8;
  auto data = global_batches(cfg, steps, global);
  for (std::string kind : {"sgd", "adam", "lamb", "lamb8"}) {
    CAPTURE(kind);
    // Single process: one mean loss over the global batch per step.
    auto single = make_mlp(cfg).value();
    auto ps = single->ordered_parameters();
    auto opt = std::move(make_optimizer(optim(kind), ps)).value();
    for (auto& b : data) {
      opt->zero_grad();
      single->compute(b.x, b.y).backward();
      clipped_step(*opt, ps, optim(kind));
    }
    // Collaborative: microbatches of 8 accumulate until the collaboration (one peer) reaches 32.
    auto model = make_mlp(cfg).value();
    coordinator_options co;
    co.progress.target_batch = global;
    solo_peer peer(co, grad_accumulator::make(model->ordered_parameters(), optim(kind)).value());
    seconds t = 0;
    peer.run(peer.core.start(t), t);
    for (auto& b : data) {
      for (int64_t at = 0; at < global; at += micro) {
        t += 0.125;
        auto x = b.x.slice(0, at, at + micro);
        auto y = b.y.slice(0, at, at + micro);
        model->compute(x, y).backward();
        REQUIRE(peer.acc.accumulate(micro).ok());
        peer.run(peer.core.samples_done(micro, t), t);
        if (t >= peer.wake)
          peer.run(peer.core.timer(t), t);
      }
    }
    CHECK(peer.core.step() == steps);
    CHECK(peer.acc.steps() == steps);
    CHECK(peer.round_samples == std::vector<uint64_t>(steps, global));
    auto diff = (flatten_parameters(ps) - flatten_parameters(peer.acc.params())).abs().max();
    CHECK(diff.item<double>() <= 1e-6);
    // The runs did move the parameters (the comparison is not between two untouched models).
    auto fresh = flatten_parameters(make_mlp(cfg).value()->ordered_parameters());
    CHECK((fresh - flatten_parameters(ps)).abs().max().item<double>() > 1e-3);
  }
}

TEST_CASE("gradients are weighted by samples, and a taken gradient leaves later ones to the next "
          "step") {
  mlp_config cfg;
  auto model = make_mlp(cfg).value();
  auto params = model->ordered_parameters();
  auto acc = grad_accumulator::make(params, optim("sgd")).value();
  auto b = global_batches(cfg, 1, 8).front();
  // The mean gradient over 8 samples, directly.
  model->compute(b.x, b.y).backward();
  auto whole = flatten_gradients(params);
  for (auto& p : params)
    p.mutable_grad().zero_();
  // The same from microbatches of 3 and 5.
  model->compute(b.x.slice(0, 0, 3), b.y.slice(0, 0, 3)).backward();
  REQUIRE(acc.accumulate(3).ok());
  CHECK(flatten_gradients(params).abs().max().item<double>() == 0.0); // .grad was zeroed
  model->compute(b.x.slice(0, 3, 8), b.y.slice(0, 3, 8)).backward();
  REQUIRE(acc.accumulate(5).ok());
  CHECK(acc.samples() == 8);
  auto t = acc.take();
  CHECK(t.samples == 8);
  CHECK((t.mean - whole).abs().max().item<double>() <= 1e-6);
  // After the take the accumulator starts from zero.
  CHECK(acc.samples() == 0);
  model->compute(b.x.slice(0, 0, 3), b.y.slice(0, 0, 3)).backward();
  auto third = flatten_gradients(params);
  REQUIRE(acc.accumulate(3).ok());
  auto next = acc.take();
  CHECK(next.samples == 3);
  CHECK((next.mean - third).abs().max().item<double>() <= 1e-6);
  // An empty take is a zero gradient with weight 0; discard drops what was accumulated.
  auto empty = acc.take();
  CHECK(empty.samples == 0);
  CHECK(empty.mean.abs().sum().item<double>() == 0.0);
  model->compute(b.x, b.y).backward();
  REQUIRE(acc.accumulate(8).ok());
  acc.discard();
  CHECK(acc.take().samples == 0);
}

TEST_CASE("stepping keeps a backward that was not accumulated yet for the next step") {
  mlp_config cfg;
  auto model = make_mlp(cfg).value();
  auto params = model->ordered_parameters();
  auto acc = grad_accumulator::make(params, optim("adam")).value();
  auto b = global_batches(cfg, 1, 8).front();
  model->compute(b.x, b.y).backward();
  REQUIRE(acc.accumulate(8).ok());
  auto g = acc.take();
  // A backward of the next step lands in .grad before the averaged gradient arrives.
  model->compute(b.x, b.y).backward();
  auto pending = flatten_gradients(params);
  auto before = flatten_parameters(params);
  auto norm = acc.apply(g.mean);
  REQUIRE(norm.ok());
  CHECK(*norm > 0);
  CHECK(torch::equal(flatten_gradients(params), pending));
  CHECK_FALSE(torch::equal(flatten_parameters(params), before));
  CHECK(acc.steps() == 1);
}

TEST_CASE("a malformed gradient from the network is refused and changes nothing") {
  mlp_config cfg;
  auto model = make_mlp(cfg).value();
  auto params = model->ordered_parameters();
  auto acc = grad_accumulator::make(params, optim("adam")).value();
  auto before = flatten_parameters(params);
  CHECK_FALSE(acc.apply(torch::zeros({acc.numel() + 1})).ok());
  CHECK_FALSE(acc.apply(torch::Tensor{}).ok());
  CHECK_FALSE(acc.apply(torch::zeros({acc.numel()}, torch::kLong)).ok());
  auto nan = torch::zeros({acc.numel()});
  nan[3] = std::nan("");
  CHECK_FALSE(acc.apply(nan).ok());
  CHECK(torch::equal(flatten_parameters(params), before));
  CHECK(acc.steps() == 0);
  // A non-finite local gradient is not accumulated either.
  for (auto& p : params)
    p.mutable_grad() = torch::full_like(p, std::nan(""));
  CHECK_FALSE(acc.accumulate(4).ok());
  CHECK(acc.samples() == 0);
}

TEST_CASE("a downloaded state continues identically on the newcomer, a bad one changes nothing") {
  mlp_config cfg;
  auto b = global_batches(cfg, 3, 8);
  for (std::string kind : {"sgd", "adam", "lamb", "lamb8"}) {
    CAPTURE(kind);
    auto donor_model = make_mlp(cfg).value();
    auto donor = grad_accumulator::make(donor_model->ordered_parameters(), optim(kind)).value();
    auto step = [&](stage_module& m, grad_accumulator& a, const batch& x) {
      m.compute(x.x, x.y).backward();
      REQUIRE(a.accumulate(8).ok());
      REQUIRE(a.apply(a.take().mean).ok());
    };
    step(*donor_model, donor, b[0]);
    step(*donor_model, donor, b[1]);
    cfg.seed = 5; // the newcomer starts elsewhere
    auto new_model = make_mlp(cfg).value();
    cfg.seed = 0;
    auto newcomer = grad_accumulator::make(new_model->ordered_parameters(), optim(kind)).value();
    auto state = donor.export_state();
    REQUIRE(state.ok());
    // Malformed states: wrong size, non-finite parameters, bad moments. Nothing changes.
    auto mine = flatten_parameters(newcomer.params());
    auto bad = *state;
    bad.params = torch::zeros({3});
    CHECK_FALSE(newcomer.import_state(bad).ok());
    bad = *state;
    bad.params = state->params.clone();
    bad.params[0] = std::nan("");
    CHECK_FALSE(newcomer.import_state(bad).ok());
    bad = *state;
    bad.optimizer.moments = torch::zeros({5});
    CHECK_FALSE(newcomer.import_state(bad).ok());
    CHECK(torch::equal(flatten_parameters(newcomer.params()), mine));
    // The real one: both continue identically.
    REQUIRE(newcomer.import_state(*state).ok());
    step(*donor_model, donor, b[2]);
    step(*new_model, newcomer, b[2]);
    CHECK(torch::equal(flatten_parameters(donor.params()), flatten_parameters(newcomer.params())));
  }
}

TEST_CASE("a lamb8 donor serves its codes and scales; the newcomer continues identically") {
  mlp_config cfg;
  cfg.width = 128; // 128 x 128 hidden weights: 8-bit moments; biases and the head: fp32
  auto b = global_batches(cfg, 3, 8);
  auto donor_model = make_mlp(cfg).value();
  auto donor = grad_accumulator::make(donor_model->ordered_parameters(), optim("lamb8")).value();
  auto step = [&](stage_module& m, grad_accumulator& a, const batch& x) {
    m.compute(x.x, x.y).backward();
    REQUIRE(a.accumulate(8).ok());
    REQUIRE(a.apply(a.take().mean).ok());
  };
  step(*donor_model, donor, b[0]);
  step(*donor_model, donor, b[1]);
  cfg.seed = 5;
  auto new_model = make_mlp(cfg).value();
  auto newcomer = grad_accumulator::make(new_model->ordered_parameters(), optim("lamb8")).value();
  auto compact = donor.export_state(moments_form::compact);
  REQUIRE(compact.ok());
  CHECK_FALSE(compact->optimizer.moments.defined());
  auto canonical = donor.export_state();
  REQUIRE(canonical.ok());
  // Codes and scales: about a quarter of the fp32 moments' bytes.
  auto fp32_bytes = static_cast<double>(canonical->optimizer.moments.nbytes());
  CHECK(static_cast<double>(compact->optimizer.packed.size()) < 0.3 * fp32_bytes);
  // A corrupt one changes nothing.
  auto mine = flatten_parameters(newcomer.params());
  auto bad = *compact;
  bad.optimizer.packed[20] ^= 0x7f;
  CHECK_FALSE(newcomer.import_state(bad).ok());
  CHECK(torch::equal(flatten_parameters(newcomer.params()), mine));
  REQUIRE(newcomer.import_state(*compact).ok());
  step(*donor_model, donor, b[2]);
  step(*new_model, newcomer, b[2]);
  CHECK(torch::equal(flatten_parameters(donor.params()), flatten_parameters(newcomer.params())));
  // A state round's vector holds the dequantized moments, and loads back to the same codes.
  auto v = donor.state_vector();
  REQUIRE(v.ok());
  auto before = donor.export_state(moments_form::compact)->optimizer.packed;
  REQUIRE(donor.load_state_vector(*v).ok());
  CHECK(donor.export_state(moments_form::compact)->optimizer.packed == before);
}

TEST_CASE("averaging two peers' state vectors gives the mean parameters and moments") {
  mlp_config cfg;
  auto b = global_batches(cfg, 2, 8);
  auto ma = make_mlp(cfg).value();
  cfg.seed = 3;
  auto mb = make_mlp(cfg).value();
  auto a = grad_accumulator::make(ma->ordered_parameters(), optim("adam")).value();
  auto c = grad_accumulator::make(mb->ordered_parameters(), optim("adam")).value();
  ma->compute(b[0].x, b[0].y).backward();
  REQUIRE(a.accumulate(8).ok());
  REQUIRE(a.apply(a.take().mean).ok());
  mb->compute(b[1].x, b[1].y).backward();
  REQUIRE(c.accumulate(8).ok());
  REQUIRE(c.apply(c.take().mean).ok());
  auto va = a.state_vector().value();
  auto vc = c.state_vector().value();
  CHECK(va.numel() == 3 * a.numel()); // parameters, first and second moments
  auto mean = (va + vc) / 2;
  REQUIRE(a.load_state_vector(mean).ok());
  REQUIRE(c.load_state_vector(mean).ok());
  CHECK(torch::equal(a.state_vector().value(), c.state_vector().value()));
  CHECK((flatten_parameters(a.params()) - mean.slice(0, 0, a.numel())).abs().max().item<double>() ==
        0.0);
  // The step counts stay the peers' own.
  CHECK(a.export_state()->optimizer.steps == std::vector<uint64_t>(a.params().size(), 1));
  CHECK_FALSE(a.load_state_vector(torch::zeros({7})).ok());
}

} // namespace starling::test::actors_grad_accumulator_test
