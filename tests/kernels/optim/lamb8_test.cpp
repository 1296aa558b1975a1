#include "kernels/flat.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/optim/lamb.hpp"
#include "kernels/optim/lamb8.hpp"
#include "kernels/optim/optimizer.hpp"
#include "kernels/optim/quant8.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace starling::test::kernels_lamb8_test {

using namespace starling::kernels;

namespace {

/// Round trip of `x` through `code`; returns the dequantized values and the block scales.
std::pair<std::vector<float>, std::vector<float>> round_trip(code8 code,
                                                             const std::vector<float>& x) {
  auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(static_cast<size_t>(quant8_blocks(n)));
  REQUIRE(quantize8(code, x.data(), n, codes.data(), scales.data()));
  REQUIRE(*std::max_element(codes.begin(), codes.end()) < code8_size(code));
  std::vector<float> y(x.size());
  dequantize8(code, codes.data(), scales.data(), n, y.data());
  return {y, scales};
}

std::vector<float> to_vector(const torch::Tensor& t) {
  auto c = t.to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

/// A small GPT (some tensors above `quant8_min_numel`, some under) and a next-token task over a
/// fixed pool of seeded sequences: a random 8-token motif repeated, so attention can learn to
/// copy it.
struct gpt_task {
  gpt_config cfg;
  torch::Tensor pool;

  gpt_task() {
    cfg.vocab = 64;
    cfg.layers = 2;
    cfg.width = 64;
    cfg.heads = 2;
    cfg.seq_len = 32;
    cfg.seed = 5;
    auto gen = seeded_generator(21);
    auto motif = torch::randint(0, cfg.vocab, {64, 8}, gen, torch::kLong);
    pool = motif.repeat({1, 5}).slice(1, 0, cfg.seq_len + 1).contiguous();
  }

  /// Trains a fresh model with `kind` for `steps` steps of 16 sequences; returns the final mean
  /// loss over the pool, and the optimizer's state bytes (`save_optimizer_state`).
  std::pair<double, size_t> train(const std::string& kind, int steps) const {
    auto model = make_gpt(cfg).value();
    auto params = model->ordered_parameters();
    optimizer_options o;
    o.kind = kind;
    o.lr = 2e-2;
    o.eps = 1e-6;
    auto opt = std::move(make_optimizer(o, params)).value();
    auto gen = seeded_generator(3);
    for (int i = 0; i < steps; ++i) {
      auto idx = torch::randint(0, pool.size(0), {16}, gen, torch::kLong);
      auto batch = pool.index_select(0, idx);
      opt->zero_grad();
      model->compute(batch.slice(1, 0, cfg.seq_len), batch.slice(1, 1, cfg.seq_len + 1)).backward();
      clipped_step(*opt, params, o);
    }
    torch::NoGradGuard guard;
    auto loss = model->forward(pool.slice(1, 0, cfg.seq_len), pool.slice(1, 1, cfg.seq_len + 1))
                    .value()
                    .item<double>();
    return {loss, save_optimizer_state(*opt).value().size()};
  }
};

/// Two parameter tensors (one quantized, one fp32) with a lamb8 over them, stepped `steps` times
/// on seeded gradients.
struct stepped {
  std::vector<torch::Tensor> params;
  std::unique_ptr<lamb8> opt;

  explicit stepped(uint64_t seed, int steps = 3) {
    auto gen = seeded_generator(seed);
    params = {torch::randn({80, 100}, gen).requires_grad_(true),
              torch::randn({30}, gen).requires_grad_(true),
              torch::randn({7}, gen).requires_grad_(true)}; // never stepped: no state
    opt = std::make_unique<lamb8>(params, lamb_options(1e-2));
    for (int i = 0; i < steps; ++i) {
      opt->zero_grad();
      (params[0].pow(2).sum() * 0.5 + (params[1] * torch::randn({30}, gen)).sum() +
       (params[0] * torch::randn({80, 100}, gen)).sum())
          .backward();
      opt->step();
    }
  }
};

} // namespace

TEST_CASE("the signed dynamic code keeps first moments within 0.71% of the block's absmax") {
  auto gen = seeded_generator(1);
  // Heavy-tailed: a few large entries set each block's scale.
  auto x = to_vector(torch::randn({20000}, gen) * torch::exp(2 * torch::randn({20000}, gen)));
  x[5] = 0.0f;
  auto [y, scales] = round_trip(code8::dynamic_signed, x);
  double worst_abs = 0, worst_rel_large = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double s = scales[i / quant8_block];
    double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    worst_abs = std::max(worst_abs, err / s);
    if (std::fabs(x[i]) >= 0.1 * s)
      worst_rel_large = std::max(worst_rel_large, err / std::fabs(x[i]));
    // The block's largest entry and signs survive exactly.
    if (std::fabs(x[i]) == s)
      CHECK(y[i] == x[i]);
    if (y[i] != 0)
      CHECK((y[i] > 0) == (x[i] > 0));
  }
  CHECK(y[5] == 0.0f);
  CHECK(worst_abs <= 0.00704);
  CHECK(worst_rel_large <= 0.071);
  MESSAGE("dynamic code: worst |error| ", worst_abs, " of absmax, ", worst_rel_large,
          " relative above a tenth of it");
}

TEST_CASE("the log code keeps second moments within 3.7% and never rounds a positive one to 0") {
  auto gen = seeded_generator(2);
  // Squares spanning ten decades, some zeros.
  auto x = to_vector(torch::pow(10.0, -10 * torch::rand({20000}, gen)));
  for (size_t i = 0; i < x.size(); i += 97)
    x[i] = 0.0f;
  auto [y, scales] = round_trip(code8::log_unsigned, x);
  double worst_rel = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double s = scales[i / quant8_block];
    if (x[i] == 0) {
      CHECK(y[i] == 0.0f);
      continue;
    }
    CHECK(y[i] > 0.0f);
    if (x[i] >= 1e-8 * s)
      worst_rel = std::max(worst_rel, std::fabs(static_cast<double>(x[i]) - y[i]) / x[i]);
    else
      CHECK(y[i] == doctest::Approx(1e-8 * s).epsilon(1e-4));
  }
  // One step of the code is 10^(8/254); nearest in log scale is within its square root.
  CHECK(worst_rel <= std::pow(10.0, 4.0 / 254) - 1 + 1e-5);
  MESSAGE("log code: worst relative error ", worst_rel);
}

TEST_CASE("codes of an all-zero block and of a tensor's partial last block") {
  std::vector<float> x(quant8_block + 10, 0.0f);
  x[quant8_block + 3] = -2.5f;
  auto [y, scales] = round_trip(code8::dynamic_signed, x);
  REQUIRE(scales.size() == 2);
  CHECK(scales[0] == 0.0f);
  CHECK(scales[1] == 2.5f);
  CHECK(y == x);
  std::vector<float> bad{1.0f, std::nanf("")};
  std::vector<uint8_t> codes(2);
  float scale = 0;
  CHECK_FALSE(quantize8(code8::log_unsigned, bad.data(), 2, codes.data(), &scale));
}

TEST_CASE("lamb8 keeps at most 30% of lamb's optimizer state bytes on a GPT") {
  gpt_config cfg; // the default byte-level GPT: 4 blocks of width 128
  auto gen = seeded_generator(4);
  auto x = torch::randint(0, cfg.vocab, {2, 32}, gen, torch::kLong);
  auto y = torch::roll(x, -1, 1);
  uint64_t bytes[2] = {0, 0}, held[2] = {0, 0};
  int64_t numel = 0;
  for (int k = 0; k < 2; ++k) {
    auto model = make_gpt(cfg).value();
    auto params = model->ordered_parameters();
    numel = total_numel(params);
    optimizer_options o;
    o.kind = k == 0 ? "lamb" : "lamb8";
    auto opt = std::move(make_optimizer(o, params)).value();
    model->compute(x, y).backward();
    opt->step();
    bytes[k] = save_optimizer_state(*opt).value().size();
    if (k == 1)
      held[k] = static_cast<lamb8&>(*opt).state_bytes();
    else
      for (auto& [key, s] : opt->state()) {
        auto& st = static_cast<lamb_param_state&>(*s);
        held[k] += st.exp_avg().nbytes() + st.exp_avg_sq().nbytes() + sizeof(int64_t);
      }
  }
  MESSAGE("GPT of ", numel, " parameters: saved state ", bytes[0], " B (lamb) vs ", bytes[1],
          " B (lamb8); held ", held[0], " vs ", held[1]);
  CHECK(static_cast<double>(bytes[1]) <= 0.30 * static_cast<double>(bytes[0]));
  CHECK(static_cast<double>(held[1]) <= 0.30 * static_cast<double>(held[0]));
}

TEST_CASE("lamb8 reaches lamb's loss within 5% on a tiny GPT sequence task") {
  gpt_task task;
  auto [l32, b32] = task.train("lamb", 80);
  auto [l8, b8] = task.train("lamb8", 80);
  MESSAGE("after 80 steps: lamb ", l32, ", lamb8 ", l8, " (state ", b32, " vs ", b8, " bytes)");
  // Both learned (the pool's loss starts at ln 64 = 4.16).
  CHECK(l32 < 3.0);
  CHECK(l8 <= 1.05 * l32);
  CHECK(b8 < b32);
}

TEST_CASE("a lamb8 state saved by one peer continues identically on another") {
  stepped a(7), b(8);
  auto bytes = save_optimizer_state(*a.opt).value();
  // b's parameters become a's; its state a's too.
  for (size_t i = 0; i < a.params.size(); ++i)
    b.params[i].detach().copy_(a.params[i].detach());
  REQUIRE(load_optimizer_state(*b.opt, bytes).ok());
  CHECK(save_optimizer_state(*b.opt).value() == bytes);
  auto gen = seeded_generator(30);
  auto g0 = torch::randn({80, 100}, gen), g1 = torch::randn({30}, gen);
  for (auto* s : {&a, &b}) {
    s->params[0].mutable_grad() = g0.clone();
    s->params[1].mutable_grad() = g1.clone();
    s->opt->step();
  }
  for (size_t i = 0; i < a.params.size(); ++i)
    CHECK(torch::equal(a.params[i], b.params[i]));
  CHECK(save_optimizer_state(*a.opt).value() == save_optimizer_state(*b.opt).value());
  // The compact moments form is the same bytes and loads the same way.
  auto compact = save_optimizer_moments(*a.opt, moments_form::compact).value();
  CHECK(compact.packed == save_optimizer_state(*a.opt).value());
  CHECK_FALSE(compact.moments.defined());
  CHECK(compact.steps == std::vector<uint64_t>{4, 4, 0});
  stepped c(9);
  REQUIRE(load_optimizer_moments(*c.opt, compact).ok());
  CHECK(save_optimizer_state(*c.opt).value() == compact.packed);
}

TEST_CASE("malformed lamb8 state bytes are refused with a reason and change nothing") {
  stepped a(7);
  auto good = save_optimizer_state(*a.opt).value();
  stepped b(8);
  auto before = save_optimizer_state(*b.opt).value();
  auto refused = [&](std::string bytes, const std::string& why) {
    auto r = load_optimizer_state(*b.opt, bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.what().find(why) != std::string::npos, r.what());
    CHECK(save_optimizer_state(*b.opt).value() == before);
  };
  // Header: magic, version, block, count.
  refused("", "STL8");
  refused("STL9" + good.substr(4), "STL8");
  auto with = [&](size_t at, const void* v, size_t n) {
    auto s = good;
    std::memcpy(s.data() + at, v, n);
    return s;
  };
  uint32_t u = 2;
  refused(with(4, &u, 4), "format version 2 (another starling build), this build reads version 1");
  u = 512;
  refused(with(8, &u, 4), "blocks of 512");
  u = 2;
  refused(with(12, &u, 4), "for 2 parameter tensors, the optimizer has 3");
  // First tensor: numel, step, form, then its arrays.
  uint64_t v64 = 8001;
  refused(with(16, &v64, 8), "8001 elements, the parameter has 8000");
  v64 = 0;
  refused(with(24, &v64, 8), "step count 0");
  v64 = (uint64_t{1} << 53) + 1;
  refused(with(24, &v64, 8), "out of range");
  uint8_t form = 1;
  refused(with(32, &form, 1), "fp32 moments for a tensor of at least 4096");
  form = 7;
  refused(with(32, &form, 1), "unknown form 7");
  float nan = std::nanf(""), neg = -1.0f;
  refused(with(33, &nan, 4), "scale");
  refused(with(33 + 4 * 32, &neg, 4), "scale");
  uint8_t code = 255;
  refused(with(33 + 8 * 32, &code, 1), "first-moment code 255");
  refused(good.substr(0, good.size() - 1), "truncated");
  refused(good + "x", "1 bytes after the last tensor");
  // The small tensor's second moment must not be negative.
  refused(with(good.size() - 17 - 4, &neg, 4), "negative");
  // Another kind's state, and lamb8's state in another kind.
  auto gen = seeded_generator(1);
  std::vector<torch::Tensor> ps{torch::randn({80, 100}, gen), torch::randn({30}, gen),
                                torch::randn({7}, gen)};
  lamb plain(ps);
  refused(save_optimizer_state(plain).value(), "STL8");
  CHECK_FALSE(load_optimizer_state(plain, good).ok());
  optimizer_moments compact;
  compact.packed = good;
  compact.steps = {3, 3, 0};
  auto r = load_optimizer_moments(plain, compact);
  REQUIRE_FALSE(r.ok());
  CHECK(r.what().find("not lamb8") != std::string::npos);
  // Steps sent beside the codes must agree with them.
  compact.steps = {3, 2, 0};
  CHECK_FALSE(load_optimizer_moments(*b.opt, compact).ok());
  CHECK(save_optimizer_state(*b.opt).value() == before);
}

TEST_CASE("state rounds average lamb8's dequantized moments, requantized on load") {
  stepped a(7), b(8);
  auto ma = save_optimizer_moments(*a.opt).value();
  auto mb = save_optimizer_moments(*b.opt).value();
  REQUIRE((ma.moments.scalar_type() == torch::kFloat));
  REQUIRE(ma.moments.numel() == 2 * (8000 + 30 + 7));
  CHECK(ma.packed.empty());
  // The canonical form of a lamb8 state loads back to the very same codes.
  auto packed = save_optimizer_state(*a.opt).value();
  REQUIRE(load_optimizer_moments(*a.opt, ma).ok());
  CHECK(save_optimizer_state(*a.opt).value() == packed);
  // The mean of two peers' moments, loaded into both, is one state again.
  optimizer_moments mean{(ma.moments + mb.moments) / 2, ma.steps, {}};
  REQUIRE(load_optimizer_moments(*a.opt, mean).ok());
  REQUIRE(load_optimizer_moments(*b.opt, mean).ok());
  CHECK(save_optimizer_state(*a.opt).value() == save_optimizer_state(*b.opt).value());
  // Requantized within the codes' bounds of the mean.
  auto back = save_optimizer_moments(*a.opt).value().moments;
  auto first = mean.moments.slice(0, 0, 8000), first_back = back.slice(0, 0, 8000);
  auto absmax = first.abs().max().item<double>();
  CHECK((first - first_back).abs().max().item<double>() <= 0.00704 * absmax);
  auto second = mean.moments.slice(0, 8037, 8037 + 8000);
  auto second_back = back.slice(0, 8037, 8037 + 8000);
  auto rel = ((second - second_back).abs() / second.clamp_min(1e-30)).max().item<double>();
  // Entries under 1e-8 of their block's scale are rounded up; none here.
  CHECK(rel <= 0.0370);
  // Non-finite or negative moments are refused before anything changes.
  auto bad = mean;
  bad.moments = mean.moments.clone();
  bad.moments[8037 + 5] = -1.0f;
  CHECK_FALSE(load_optimizer_moments(*a.opt, bad).ok());
  CHECK(save_optimizer_state(*a.opt).value() == save_optimizer_state(*b.opt).value());
}

TEST_CASE("make_optimizer builds lamb8, and torch::save of it round-trips") {
  auto gen = seeded_generator(3);
  std::vector<torch::Tensor> ps{torch::randn({70, 70}, gen).requires_grad_(true)};
  optimizer_options o;
  o.kind = "lamb8";
  auto opt = std::move(make_optimizer(o, ps)).value();
  REQUIRE(dynamic_cast<lamb8*>(opt.get()) != nullptr);
  ps[0].pow(2).sum().backward();
  opt->step();
  torch::serialize::OutputArchive out;
  opt->save(out);
  std::ostringstream s;
  out.save_to(s);
  auto other = std::move(make_optimizer(o, ps)).value();
  torch::serialize::InputArchive in;
  std::istringstream is(s.str());
  in.load_from(is);
  other->load(in);
  CHECK(save_optimizer_state(*other).value() == save_optimizer_state(*opt).value());
  o.kind = "lamb9";
  auto bad = make_optimizer(o, ps);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().what.find("\"lamb8\"") != std::string::npos);
}

} // namespace starling::test::kernels_lamb8_test
