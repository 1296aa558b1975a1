#include "actors/collab/diloco.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "kernels/flat.hpp"
#include "kernels/models/stage_module.hpp"

namespace starling::test::actors_diloco_test {

using namespace starling::actors::collab;
using namespace starling::kernels;

namespace {

diloco_options dense(uint64_t h = 1) {
  diloco_options o;
  o.inner_steps = h;
  o.codec = codec_id::none;
  o.codec_params = {};
  o.error_feedback = false;
  return o;
}

void set_flat(const std::vector<torch::Tensor>& params, const torch::Tensor& flat) {
  REQUIRE(unflatten_parameters(flat, params).ok());
}

double max_abs(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

} // namespace

TEST_CASE("DiLoCo options are validated") {
  CHECK(validate(diloco_options{}).ok());
  auto o = diloco_options{};
  o.inner_steps = 0;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.codec = codec_id::randk;
  CHECK_FALSE(validate(o).ok()); // EF needs a contractive codec
  o.error_feedback = false;
  CHECK(validate(o).ok());
  o = {};
  o.codec_params.ratio = 0;
  CHECK_FALSE(validate(o).ok());
  // The defaults are DiLoCo's: Nesterov SGD 0.7/0.9 outside, Top-k 0.5% with EF on the wire.
  auto d = diloco_options{};
  CHECK(d.outer.kind == "sgd");
  CHECK(d.outer.nesterov);
  CHECK(d.codec == codec_id::topk);
  CHECK(d.codec_params.ratio == 0.005);
  CHECK(d.error_feedback);
}

TEST_CASE("an outer step after H inner steps matches the hand-computed Nesterov update") {
  auto w = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -1.0f}).requires_grad_(true);
  std::vector<torch::Tensor> params{w};
  auto peer = diloco_peer::make(params, dense(3)).value();
  auto w0 = flatten_parameters(params);
  // Three inner steps move the parameters by d1 in all (whatever the inner optimizer did).
  auto d1 = torch::tensor({0.1f, 0.2f, -0.3f, 0.0f, 0.05f, -0.1f});
  CHECK_FALSE(peer.inner_step_done());
  CHECK_FALSE(peer.inner_step_done());
  set_flat(params, w0 - d1);
  CHECK(peer.inner_step_done());
  CHECK(max_abs(peer.pseudo_gradient() - d1) <= 1e-7);
  // One peer: the reducer's average is its own pseudo-gradient.
  diloco_reducer red(6, codec_id::none, {}, false);
  REQUIRE(red.add(peer.outgoing().value(), 1.0).ok());
  REQUIRE(peer.outer_step(red.finish(1).value()).ok());
  // Nesterov, lr 0.7, mu 0.9: buf = d1; w1 = w0 - lr (d1 + mu buf).
  auto w1 = w0 - 0.7 * (d1 + 0.9 * d1);
  CHECK(max_abs(flatten_parameters(params) - w1) <= 1e-6);
  CHECK(max_abs(peer.start() - w1) <= 1e-6);
  CHECK(peer.inner_steps() == 0);
  CHECK(peer.outer_steps() == 1);
  // Second outer step: buf = mu d1 + d2; w2 = w1 - lr (d2 + mu buf).
  auto d2 = torch::tensor({-0.2f, 0.1f, 0.0f, 0.3f, -0.05f, 0.2f});
  set_flat(params, w1 - d2);
  REQUIRE(red.add(peer.outgoing().value(), 1.0).ok());
  REQUIRE(peer.outer_step(red.finish(1).value()).ok());
  auto w2 = w1 - 0.7 * (d2 + 0.9 * (0.9 * d1 + d2));
  CHECK(max_abs(flatten_parameters(params) - w2) <= 1e-6);
}

TEST_CASE("peers that start equal take the same outer step on the weighted average") {
  auto make = [] { return torch::zeros({4}).requires_grad_(true); };
  std::vector<torch::Tensor> pa{make()}, pb{make()};
  auto a = diloco_peer::make(pa, dense()).value();
  auto b = diloco_peer::make(pb, dense()).value();
  auto da = torch::tensor({1.0f, 0.0f, 2.0f, -1.0f});
  auto db = torch::tensor({0.0f, 1.0f, -2.0f, 2.0f});
  set_flat(pa, -da);
  set_flat(pb, -db);
  diloco_reducer red(4, codec_id::none, {}, false);
  REQUIRE(red.add(a.outgoing().value(), 3.0).ok());
  REQUIRE(red.add(b.outgoing().value(), 1.0).ok());
  auto mean = (3 * da + db) / 4;
  CHECK(max_abs(red.mean() - mean) <= 1e-7);
  auto avg = red.finish(2).value();
  REQUIRE(a.outer_step(avg).ok());
  REQUIRE(b.outer_step(avg).ok());
  CHECK(torch::equal(flatten_parameters(pa), flatten_parameters(pb)));
  CHECK(max_abs(flatten_parameters(pa) + 0.7 * 1.9 * mean) <= 1e-6);
  // Nothing to average is a failure, and so is a bad weight or a contribution of another size.
  CHECK_FALSE(red.finish(2).ok());
  CHECK_FALSE(red.add(a.outgoing().value(), 0.0).ok());
  diloco_reducer other(5, codec_id::none, {}, false);
  CHECK_FALSE(other.add(a.outgoing().value(), 1.0).ok());
}

TEST_CASE("Top-k 0.5% with error feedback moves at least 100x fewer bytes than fp32 in both "
          "directions") {
  constexpr int peers = 4, rounds = 4, inner = 5;
  constexpr int64_t n = 200'000;
  auto gen = seeded_generator(17);
  auto init = torch::randn({n}, gen);
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<diloco_peer> ps;
  std::vector<torch::Tensor> sum_delta, sum_sent;
  diloco_options o;
  o.inner_steps = inner;
  for (int i = 0; i < peers; ++i) {
    params.push_back({init.clone().requires_grad_(true)});
    ps.push_back(diloco_peer::make(params.back(), o).value());
    sum_delta.push_back(torch::zeros({n}));
    sum_sent.push_back(torch::zeros({n}));
  }
  diloco_reducer red(n, o.codec, o.codec_params, o.error_feedback);
  torch::Tensor sum_means = torch::zeros({n}), sum_results = torch::zeros({n});
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < peers; ++i) {
      // Inner steps: each peer drifts its own way (a stand-in for its local optimizer).
      bool due = false;
      for (int s = 0; s < inner; ++s) {
        torch::NoGradGuard g;
        params[i][0].sub_(0.01 * torch::randn({n}, gen) + 0.002 * (i + 1));
        due = ps[i].inner_step_done();
      }
      CHECK(due);
      sum_delta[i] += ps[i].pseudo_gradient();
      auto w = ps[i].outgoing().value();
      sum_sent[i] += decode_wire(w, n).value();
      REQUIRE(red.add(w, 1.0).ok());
    }
    sum_means += red.mean();
    auto avg = red.finish(peers).value();
    sum_results += decode_wire(avg, n).value();
    for (int i = 0; i < peers; ++i)
      REQUIRE(ps[i].outer_step(avg).ok());
    // Every peer applied the same bytes: they stay equal.
    for (int i = 1; i < peers; ++i)
      CHECK(torch::equal(flatten_parameters(params[i]), flatten_parameters(params[0])));
  }
  double fp32 = 4.0 * n * rounds;
  for (int i = 0; i < peers; ++i) {
    CAPTURE(i);
    auto sent = static_cast<double>(ps[i].bytes().sent);
    auto received = static_cast<double>(ps[i].bytes().received);
    CHECK(fp32 / sent >= 100.0);
    CHECK(fp32 / received >= 100.0);
    // Error feedback: what was sent plus what is still owed is exactly what there was to send.
    CHECK(max_abs(sum_sent[i] + ps[i].residual() - sum_delta[i]) <= 1e-4);
  }
  CHECK(fp32 * peers / static_cast<double>(red.bytes().received) >= 100.0);
  CHECK(fp32 * peers / static_cast<double>(red.bytes().sent) >= 100.0);
  // The reducer's own EF on the re-sparsified averages keeps the same books.
  CHECK(max_abs(sum_results + red.residual() - sum_means) <= 1e-4);
}

namespace {

/// DiLoCo on peers that minimize 0.5 ||w - c_i||^2 with `inner_lr` SGD steps inside; returns
/// the distance to the mean of the c_i (the outer iteration's fixed point) after `rounds`
/// outer steps, relative to the start.
double quadratic_run(const diloco_options& o, int rounds, double inner_lr, double spread) {
  constexpr int peers = 3;
  constexpr int64_t n = 2'000;
  auto gen = seeded_generator(3);
  auto common = torch::randn({n}, gen);
  std::vector<torch::Tensor> targets;
  for (int i = 0; i < peers; ++i)
    targets.push_back(common + spread * torch::randn({n}, gen));
  auto optimum = (targets[0] + targets[1] + targets[2]) / 3;
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<diloco_peer> ps;
  for (int i = 0; i < peers; ++i) {
    params.push_back({torch::zeros({n}).requires_grad_(true)});
    ps.push_back(diloco_peer::make(params.back(), o).value());
  }
  auto first = max_abs(flatten_parameters(params[0]) - optimum);
  diloco_reducer red(n, o.codec, o.codec_params, o.error_feedback);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < peers; ++i) {
      for (uint64_t s = 0; s < o.inner_steps; ++s) {
        torch::NoGradGuard g;
        params[i][0].sub_(inner_lr * (params[i][0] - targets[static_cast<size_t>(i)]));
        ps[i].inner_step_done();
      }
      REQUIRE(red.add(ps[i].outgoing().value(), 1.0).ok());
    }
    auto avg = red.finish(peers).value();
    for (int i = 0; i < peers; ++i)
      REQUIRE(ps[i].outer_step(avg).ok());
  }
  return max_abs(flatten_parameters(params[0]) - optimum) / first;
}

} // namespace

TEST_CASE("DiLoCo with dense pseudo-gradients finds the peers' common optimum") {
  auto o = dense(10);
  o.outer = default_outer_optimizer(); // Nesterov 0.7 / 0.9
  CHECK(quadratic_run(o, 150, 0.1, 1.0) < 1e-5);
}

TEST_CASE("DiLoCo with Top-k and error feedback on both sides reaches the optimum peers share") {
  // Outer SGD without momentum (error feedback already carries past updates forward, as in
  // SparseLoCo). With Nesterov 0.9 the delays EF adds made this quadratic diverge, and with
  // peers that disagree EF leaves a floor: see COLLAB.md.
  diloco_options o;
  o.inner_steps = 10;
  o.codec_params.ratio = 0.05;
  o.outer.momentum = 0;
  o.outer.nesterov = false;
  CHECK(quadratic_run(o, 150, 0.01, 0.0) < 1e-3);
}

TEST_CASE("a malformed wire tensor is refused, never a crash") {
  auto w = torch::zeros({1000}).requires_grad_(true);
  std::vector<torch::Tensor> params{w};
  auto peer = diloco_peer::make(params, diloco_options{}).value();
  {
    torch::NoGradGuard g;
    w.sub_(torch::arange(1000, torch::kFloat) / 1000);
  }
  auto good = peer.outgoing().value();
  REQUIRE(decode_wire(good, 1000).ok());
  CHECK_FALSE(decode_wire(good, 999).ok());
  auto cut = good;
  cut.bytes.pop_back();
  CHECK_FALSE(decode_wire(cut, 1000).ok());
  auto nan = good;
  float bad = std::nanf("");
  std::memcpy(nan.bytes.data() + nan.bytes.size() - 4, &bad, 4);
  CHECK_FALSE(decode_wire(nan, 1000).ok());
  auto codec = good;
  codec.header.codec = static_cast<codec_id>(42);
  CHECK_FALSE(decode_wire(codec, 1000).ok());
  // A refused averaged result changes nothing.
  auto before = flatten_parameters(params);
  CHECK_FALSE(peer.outer_step(cut).ok());
  CHECK(torch::equal(flatten_parameters(params), before));
  CHECK(peer.outer_steps() == 0);
}

} // namespace starling::test::actors_diloco_test
