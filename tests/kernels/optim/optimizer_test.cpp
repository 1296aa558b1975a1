#include "kernels/flat.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/mlp.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/optim/lamb.hpp"
#include "kernels/optim/optimizer.hpp"

#include <doctest/doctest.h>

#include <cmath>

namespace starling::test::kernels_optimizer_test {

using namespace starling::kernels;

namespace {

/// f(w) = 0.5 * ||A w - b||^2 with a well-conditioned random A.
struct quadratic {
  torch::Tensor a, b;
  explicit quadratic(uint64_t seed) {
    auto gen = seeded_generator(seed);
    a = torch::eye(20) + 0.1 * torch::randn({20, 20}, gen);
    b = torch::randn({20}, gen);
  }
  torch::Tensor operator()(const torch::Tensor& w) const {
    return 0.5 * (torch::mv(a, w) - b).pow(2).sum();
  }
};

/// Two MLPs initialized differently (peers a and b), an optimizer kind and a fixed batch.
struct two_peers {
  mlp_config cfg;
  std::shared_ptr<stage_module> a, b;
  std::vector<torch::Tensor> pa, pb;
  optimizer_options o;
  torch::Tensor x, y;

  explicit two_peers(const std::string& kind) {
    a = make_mlp(cfg).value();
    cfg.seed = 77;
    b = make_mlp(cfg).value();
    pa = a->ordered_parameters();
    pb = b->ordered_parameters();
    o.kind = kind;
    o.lr = 1e-2;
    auto gen = seeded_generator(9);
    x = torch::randn({8, cfg.inputs}, gen);
    y = torch::randint(0, cfg.classes, {8}, gen, torch::kLong);
  }

  /// `steps` optimizer steps of `m` on the fixed batch.
  void train(stage_module& m, torch::optim::Optimizer& opt, int steps = 1) const {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      m.compute(x, y).backward();
      opt.step();
    }
  }
};

} // namespace

TEST_CASE("LAMB decreases a quadratic") {
  quadratic f(4);
  auto gen = seeded_generator(8);
  auto w = torch::randn({20}, gen).requires_grad_(true);
  lamb opt({w}, lamb_options(0.01));
  auto initial = f(w).item<double>();
  double last = initial;
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    auto loss = f(w);
    loss.backward();
    opt.step();
    last = loss.item<double>();
  }
  CHECK(last < 0.01 * initial);
  REQUIRE(opt.last_trust_ratios().size() == 1);
  CHECK(opt.last_trust_ratios()[0] > 0.0);
}

TEST_CASE("LAMB scales each tensor's step by its trust ratio") {
  // One step from zero moments: the Adam direction is sign(g) (up to eps), so the step's norm is
  // lr * ||w||, whatever the gradient's magnitude.
  auto w = torch::full({4}, 3.0).requires_grad_(true); // ||w|| = 6
  lamb opt({w}, lamb_options(0.1).eps(0));
  w.mutable_grad() = torch::tensor({1e-3, -5.0, 2.0, 7.0});
  auto before = w.detach().clone();
  opt.step();
  auto step = (w.detach() - before).norm().item<double>();
  CHECK(step == doctest::Approx(0.1 * 6.0).epsilon(1e-5));
}

TEST_CASE("clipping by global norm bounds the gradients' norm") {
  auto a = torch::zeros({3}).requires_grad_(true);
  auto b = torch::zeros({4}).requires_grad_(true);
  auto c = torch::zeros({2}).requires_grad_(true); // no gradient: counts as zero
  a.mutable_grad() = torch::full({3}, 2.0);
  b.mutable_grad() = torch::full({4}, 2.0);
  std::vector<torch::Tensor> ps{a, b, c};
  auto norm = clip_by_global_norm(ps, 1.0);
  CHECK(norm == doctest::Approx(std::sqrt(7.0 * 4.0)));
  CHECK(gradient_norm(ps) == doctest::Approx(1.0).epsilon(1e-4));
  // Ratios between gradients are kept.
  CHECK(a.grad()[0].item<double>() == doctest::Approx(b.grad()[0].item<double>()));
  // Below the bound nothing changes.
  auto small = gradient_norm(ps);
  CHECK(clip_by_global_norm(ps, 10.0) == doctest::Approx(small));
  CHECK(gradient_norm(ps) == doctest::Approx(small));
}

TEST_CASE("make_optimizer builds Adam and LAMB and rejects bad options") {
  auto w = torch::zeros({2}).requires_grad_(true);
  optimizer_options o;
  CHECK(make_optimizer(o, {w}).ok());
  o.kind = "lamb";
  CHECK(make_optimizer(o, {w}).ok());
  o.kind = "sgd!";
  CHECK_FALSE(make_optimizer(o, {w}).ok());
  o.kind = "adam";
  o.beta1 = 1.0;
  CHECK_FALSE(make_optimizer(o, {w}).ok());
}

TEST_CASE("make_optimizer builds SGD with momentum and Nesterov and rejects bad SGD options") {
  auto w = torch::zeros({2}).requires_grad_(true);
  optimizer_options o;
  o.kind = "sgd";
  CHECK(make_optimizer(o, {w}).ok());
  o.momentum = 0.9;
  o.nesterov = true;
  CHECK(make_optimizer(o, {w}).ok());
  o.momentum = 0;
  CHECK_FALSE(make_optimizer(o, {w}).ok()); // Nesterov without momentum
  o.nesterov = false;
  o.momentum = 1.0;
  CHECK_FALSE(make_optimizer(o, {w}).ok());
  o.momentum = -0.1;
  CHECK_FALSE(make_optimizer(o, {w}).ok());
}

TEST_CASE("SGD with Nesterov momentum takes the hand-computed steps") {
  auto w = torch::tensor({1.0f, 2.0f}).requires_grad_(true);
  optimizer_options o;
  o.kind = "sgd";
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  auto opt = std::move(make_optimizer(o, {w})).value();
  auto g = torch::tensor({0.5f, -1.0f});
  // Step 1: buf = g; w -= lr (g + mu buf). Step 2: buf = mu buf + g; w -= lr (g + mu buf).
  w.mutable_grad() = g.clone();
  opt->step();
  auto expect = torch::tensor({1.0f, 2.0f}) - 0.1 * (g + 0.9 * g);
  CHECK(torch::allclose(w.detach(), expect, 0, 1e-6));
  w.mutable_grad() = g.clone();
  opt->step();
  expect = expect - 0.1 * (g + 0.9 * (0.9 * g + g));
  CHECK(torch::allclose(w.detach(), expect, 0, 1e-6));
}

TEST_CASE("SGD's momentum buffers travel in the canonical form and continue identically") {
  two_peers t{"sgd"};
  t.o.momentum = 0.9;
  auto opt_a = std::move(make_optimizer(t.o, t.pa)).value();
  auto opt_b = std::move(make_optimizer(t.o, t.pb)).value();
  auto fresh = save_optimizer_moments(*opt_a);
  REQUIRE(fresh.ok());
  for (auto s : fresh->steps)
    CHECK(s == 0);
  t.train(*t.a, *opt_a, 3);
  REQUIRE(unflatten_parameters(flatten_parameters(t.pa), t.pb).ok());
  auto m = save_optimizer_moments(*opt_a);
  REQUIRE(m.ok());
  CHECK(m->moments.numel() == 2 * flatten_parameters(t.pa).numel());
  CHECK(m->moments.abs().sum().item<double>() > 0);
  for (auto s : m->steps)
    CHECK(s == 1);
  REQUIRE(load_optimizer_moments(*opt_b, *m).ok());
  t.train(*t.a, *opt_a);
  t.train(*t.b, *opt_b);
  CHECK(torch::equal(flatten_parameters(t.pa), flatten_parameters(t.pb)));
}

TEST_CASE("Adam and LAMB with clipping lower a tiny GPT's loss on a fixed batch") {
  gpt_config cfg;
  cfg.layers = 2;
  cfg.width = 32;
  cfg.heads = 2;
  cfg.seq_len = 16;
  auto gen = seeded_generator(1);
  auto x = torch::randint(0, 256, {4, 16}, gen, torch::kLong);
  auto y = torch::roll(x, -1, 1);
  for (std::string kind : {"adam", "lamb"}) {
    CAPTURE(kind);
    auto model = make_gpt(cfg).value();
    auto params = model->ordered_parameters();
    optimizer_options o;
    o.kind = kind;
    // LAMB steps each tensor by lr * ||w||: it wants a larger lr than Adam.
    o.lr = kind == "adam" ? 3e-3 : 5e-2;
    auto opt = std::move(make_optimizer(o, params)).value();
    auto first = model->forward(x, y).value().item<double>();
    for (int i = 0; i < 30; ++i) {
      opt->zero_grad();
      model->compute(x, y).backward();
      clipped_step(*opt, params, o);
    }
    auto after = model->forward(x, y).value().item<double>();
    CHECK(after < 0.8 * first);
  }
}

TEST_CASE("optimizer state saved by one peer continues identically on another") {
  for (std::string kind : {"adam", "lamb"}) {
    CAPTURE(kind);
    two_peers t{kind};
    auto opt_a = std::move(make_optimizer(t.o, t.pa)).value();
    t.train(*t.a, *opt_a, 3);
    // Peer b downloads parameters and optimizer state.
    REQUIRE(unflatten_parameters(flatten_parameters(t.pa), t.pb).ok());
    auto opt_b = std::move(make_optimizer(t.o, t.pb)).value();
    auto bytes = save_optimizer_state(*opt_a);
    REQUIRE(bytes.ok());
    auto loaded = load_optimizer_state(*opt_b, *bytes);
    REQUIRE_MESSAGE(loaded.ok(), loaded.what());
    // Peer c gets the parameters only, with a fresh optimizer: the control.
    auto c = make_mlp(t.cfg).value();
    auto pc = c->ordered_parameters();
    REQUIRE(unflatten_parameters(flatten_parameters(t.pa), pc).ok());
    auto opt_c = std::move(make_optimizer(t.o, pc)).value();
    t.train(*t.a, *opt_a);
    t.train(*t.b, *opt_b);
    t.train(*c, *opt_c);
    CHECK(torch::equal(flatten_parameters(t.pa), flatten_parameters(t.pb)));
    CHECK_FALSE(torch::equal(flatten_parameters(t.pa), flatten_parameters(pc)));
  }
}

TEST_CASE("malformed or mismatched optimizer state is a failure") {
  auto w = torch::zeros({3}).requires_grad_(true);
  auto v = torch::zeros({5}).requires_grad_(true);
  optimizer_options o;
  auto opt_w = std::move(make_optimizer(o, {w})).value();
  w.mutable_grad() = torch::ones({3});
  opt_w->step();
  auto opt_v = std::move(make_optimizer(o, {v})).value();
  CHECK_FALSE(load_optimizer_state(*opt_v, "not a checkpoint").ok());
  v.mutable_grad() = torch::ones({5});
  opt_v->step();
  auto moment = [&] {
    auto& st = opt_v->state().at(c10::guts::to_string(v.unsafeGetTensorImpl()));
    return static_cast<torch::optim::AdamParamState&>(*st).exp_avg().clone();
  };
  auto v_moment = moment();
  CHECK_FALSE(load_optimizer_state(*opt_v, *save_optimizer_state(*opt_w)).ok());
  // The mismatch left v's own state in place.
  CHECK(torch::equal(moment(), v_moment));
}

TEST_CASE("canonical optimizer moments continue identically on another peer and are equal bit "
          "for bit where LibTorch's archives differ") {
  for (std::string kind : {"adam", "lamb"}) {
    CAPTURE(kind);
    two_peers t{kind};
    auto opt_a = std::move(make_optimizer(t.o, t.pa)).value();
    auto opt_b = std::move(make_optimizer(t.o, t.pb)).value();
    // Before any step: zero moments, zero steps.
    auto fresh = save_optimizer_moments(*opt_a);
    REQUIRE(fresh.ok());
    CHECK(fresh->moments.numel() == 2 * flatten_parameters(t.pa).numel());
    CHECK(fresh->moments.abs().sum().item<double>() == 0);
    for (auto s : fresh->steps)
      CHECK(s == 0);
    t.train(*t.a, *opt_a, 3);
    REQUIRE(unflatten_parameters(flatten_parameters(t.pa), t.pb).ok());
    auto m = save_optimizer_moments(*opt_a);
    REQUIRE(m.ok());
    for (auto s : m->steps)
      CHECK(s == 3);
    REQUIRE(load_optimizer_moments(*opt_b, *m).ok());
    auto again = save_optimizer_moments(*opt_b);
    REQUIRE(again.ok());
    CHECK(torch::equal(again->moments, m->moments));
    CHECK(again->steps == m->steps);
    t.train(*t.a, *opt_a);
    t.train(*t.b, *opt_b);
    CHECK(torch::equal(flatten_parameters(t.pa), flatten_parameters(t.pb)));
  }
}

TEST_CASE("malformed canonical optimizer moments are a failure and change nothing") {
  auto w = torch::zeros({3}).requires_grad_(true);
  optimizer_options o;
  auto opt = std::move(make_optimizer(o, {w})).value();
  w.mutable_grad() = torch::ones({3});
  opt->step();
  auto good = save_optimizer_moments(*opt).value();
  auto bad = [&](optimizer_moments m) {
    auto r = load_optimizer_moments(*opt, m);
    CHECK_FALSE(r.ok());
    auto now = save_optimizer_moments(*opt).value();
    CHECK(torch::equal(now.moments, good.moments));
    CHECK(now.steps == good.steps);
  };
  bad({torch::zeros({5}), {1}});                                  // wrong size
  bad({good.moments, {1, 1}});                                    // wrong tensor count
  bad({good.moments.to(torch::kDouble), {1}});                    // wrong dtype
  bad({torch::full({6}, std::nan("")), {1}});                     // not finite
  bad({torch::cat({torch::zeros({3}), -torch::ones({3})}), {1}}); // negative second moment
  bad({good.moments, {(uint64_t{1} << 53) + 1}});                 // step out of range
  bad({torch::Tensor{}, {1}});                                    // nothing
  CHECK(load_optimizer_moments(*opt, good).ok());
}

TEST_CASE("warmup: the learning rate rises linearly to lr over warmup_steps, then stays") {
  kernels::optimizer_options o;
  o.lr = 1e-3;
  CHECK(kernels::scheduled_lr(o, 0) == doctest::Approx(1e-3)); // no warmup
  o.warmup_steps = 5;
  CHECK(kernels::scheduled_lr(o, 0) == doctest::Approx(2e-4));
  CHECK(kernels::scheduled_lr(o, 3) == doctest::Approx(8e-4));
  CHECK(kernels::scheduled_lr(o, 4) == doctest::Approx(1e-3));
  CHECK(kernels::scheduled_lr(o, 1000) == doctest::Approx(1e-3));
  // The optimizer takes it: an Adam step's size follows the rate set before it.
  auto p = torch::zeros({3}, torch::requires_grad());
  auto opt = kernels::make_optimizer(o, {p});
  REQUIRE(opt);
  kernels::set_learning_rate(**opt, kernels::scheduled_lr(o, 0));
  p.mutable_grad() = torch::ones({3});
  (*opt)->step();
  // Adam's first step moves each coordinate by lr (bias-corrected m/sqrt(v) = 1).
  CHECK(p.detach()[0].item<double>() == doctest::Approx(-2e-4).epsilon(1e-3));
}

} // namespace starling::test::kernels_optimizer_test
