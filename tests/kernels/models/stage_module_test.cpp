#include "kernels/flat.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/mlp.hpp"

#include <doctest/doctest.h>

#include <map>

namespace starling::test::kernels_stage_module_test {

using namespace starling::kernels;

namespace {

std::shared_ptr<stage_module> must(starling::result<std::shared_ptr<stage_module>> r) {
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  return std::move(r).value();
}

template <class T>
T must(starling::result<T> r) {
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  return std::move(r).value();
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a - b).abs().max().item<double>();
}

std::map<std::string, torch::Tensor> grads_by_name(const stage_module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& kv : m.named_parameters(true)) {
    REQUIRE_MESSAGE(kv.value().grad().defined(), kv.key());
    out.emplace(kv.key(), kv.value().grad().clone());
  }
  return out;
}

gpt_config small_gpt() {
  gpt_config cfg;
  cfg.layers = 6;
  cfg.width = 32;
  cfg.heads = 4;
  cfg.seq_len = 16;
  cfg.seed = 7;
  return cfg;
}

/// Runs forward then backward through `stages` as a trainer would; returns the loss.
double pipeline_step(std::vector<std::shared_ptr<stage_module>>& stages, const torch::Tensor& x,
                     const torch::Tensor& y) {
  std::vector<torch::Tensor> inputs{x};
  for (size_t i = 0; i + 1 < stages.size(); ++i)
    inputs.push_back(must(stages[i]->forward(inputs.back())));
  auto loss = must(stages.back()->forward(inputs.back(), y)).item<double>();
  torch::Tensor grad;
  for (size_t i = stages.size(); i-- > 0;) {
    auto g =
        must(stages[i]->backward(inputs[i], grad, i + 1 == stages.size() ? y : torch::Tensor{}));
    grad = g.grad_input;
    if (i + 1 == stages.size())
      CHECK(g.output.item<double>() == doctest::Approx(loss).epsilon(1e-6));
  }
  CHECK_FALSE(grad.defined()); // the first stage has no input gradient
  return loss;
}

void check_split_matches_whole(std::shared_ptr<stage_module> whole,
                               std::vector<std::shared_ptr<stage_module>> stages,
                               const torch::Tensor& x, const torch::Tensor& y) {
  // Same seed gives the same parameters, layer for layer.
  std::map<std::string, torch::Tensor> whole_params;
  for (auto& kv : whole->named_parameters(true))
    whole_params.emplace(kv.key(), kv.value());
  size_t seen = 0;
  for (auto& s : stages)
    for (auto& kv : s->named_parameters(true)) {
      REQUIRE_MESSAGE(whole_params.count(kv.key()) == 1, kv.key());
      CHECK_MESSAGE(torch::equal(whole_params[kv.key()], kv.value()), kv.key());
      ++seen;
    }
  CHECK(seen == whole_params.size());

  auto whole_loss = whole->compute(x, y);
  whole_loss.backward();
  auto split_loss = pipeline_step(stages, x, y);
  CHECK(std::abs(split_loss - whole_loss.item<double>()) <= 1e-5);

  auto expected = grads_by_name(*whole);
  for (auto& s : stages)
    for (auto& [name, g] : grads_by_name(*s))
      CHECK_MESSAGE(max_abs_diff(g, expected[name]) <= 1e-5, name);
}

} // namespace

TEST_CASE("a GPT cut into 3 stages gives the unsplit model's loss and gradients") {
  auto cfg = small_gpt();
  auto gen = seeded_generator(11);
  auto x = torch::randint(0, 256, {4, 16}, gen, torch::kLong);
  auto y = torch::randint(0, 256, {4, 16}, gen, torch::kLong);
  check_split_matches_whole(must(make_gpt(cfg)),
                            {must(make_gpt_stage(cfg, 0, 2)), must(make_gpt_stage(cfg, 2, 5)),
                             must(make_gpt_stage(cfg, 5, 6))},
                            x, y);
}

TEST_CASE("a GPT stage accepts sequences shorter than seq_len") {
  auto cfg = small_gpt();
  auto gen = seeded_generator(3);
  auto x = torch::randint(0, 256, {2, 5}, gen, torch::kLong);
  auto y = torch::randint(0, 256, {2, 5}, gen, torch::kLong);
  check_split_matches_whole(must(make_gpt(cfg)),
                            {must(make_gpt_stage(cfg, 0, 3)), must(make_gpt_stage(cfg, 3, 6))}, x,
                            y);
}

TEST_CASE("a GPT is causal: a later token does not change earlier outputs") {
  auto cfg = small_gpt();
  auto first = must(make_gpt_stage(cfg, 0, 3));
  auto gen = seeded_generator(5);
  auto x = torch::randint(0, 256, {1, 16}, gen, torch::kLong);
  auto x2 = x.clone();
  x2[0][15] = (x[0][15].item<int64_t>() + 1) % 256;
  auto a = must(first->forward(x));
  auto b = must(first->forward(x2));
  CHECK(max_abs_diff(a.narrow(1, 0, 15), b.narrow(1, 0, 15)) == 0.0);
  CHECK(max_abs_diff(a.narrow(1, 15, 1), b.narrow(1, 15, 1)) > 0.0);
}

TEST_CASE("an MLP cut into 3 stages gives the unsplit model's loss and gradients") {
  mlp_config cfg;
  cfg.layers = 5;
  cfg.seed = 21;
  auto gen = seeded_generator(2);
  auto x = torch::randn({8, cfg.inputs}, gen);
  auto y = torch::randint(0, cfg.classes, {8}, gen, torch::kLong);
  check_split_matches_whole(must(make_mlp(cfg)),
                            {must(make_mlp_stage(cfg, 0, 1)), must(make_mlp_stage(cfg, 1, 4)),
                             must(make_mlp_stage(cfg, 4, 5))},
                            x, y);
}

TEST_CASE("backward on another peer of the same stage gives the same gradients") {
  auto cfg = small_gpt();
  auto gen = seeded_generator(13);
  auto x = torch::randint(0, 256, {3, 16}, gen, torch::kLong);
  auto first = must(make_gpt_stage(cfg, 0, 2));
  auto act = must(first->forward(x));
  auto grad_out = torch::randn(act.sizes(), gen);

  auto peer_a = must(make_gpt_stage(cfg, 2, 4));
  // Peer b starts from other parameters and downloads peer a's state, as a respawned peer would.
  auto other = cfg;
  other.seed = 99;
  auto peer_b = must(make_gpt_stage(other, 2, 4));
  CHECK_FALSE(torch::equal(flatten_parameters(peer_a->ordered_parameters()),
                           flatten_parameters(peer_b->ordered_parameters())));
  REQUIRE(unflatten_parameters(flatten_parameters(peer_a->ordered_parameters()),
                               peer_b->ordered_parameters())
              .ok());

  // Peer a serves a forward first (inference only: leaves no gradient, keeps no state).
  must(peer_a->forward(act));
  for (auto& p : peer_a->ordered_parameters())
    CHECK_FALSE(p.grad().defined());
  auto ga = must(peer_a->backward(act, grad_out));
  auto gb = must(peer_b->backward(act, grad_out));
  CHECK(max_abs_diff(ga.grad_input, gb.grad_input) == 0.0);
  CHECK(max_abs_diff(flatten_gradients(peer_a->ordered_parameters()),
                     flatten_gradients(peer_b->ordered_parameters())) == 0.0);

  // A second backward accumulates: gradients double.
  auto before = flatten_gradients(peer_a->ordered_parameters());
  must(peer_a->backward(act, grad_out));
  CHECK(max_abs_diff(flatten_gradients(peer_a->ordered_parameters()), 2 * before) <= 1e-6);
}

TEST_CASE("stages reject malformed inputs with a failure") {
  auto cfg = small_gpt();
  auto first = must(make_gpt_stage(cfg, 0, 2));
  auto middle = must(make_gpt_stage(cfg, 2, 4));
  auto last = must(make_gpt_stage(cfg, 4, 6));
  auto tokens = torch::zeros({2, 8}, torch::kLong);
  CHECK_FALSE(first->forward(torch::zeros({2, 8})).ok());                   // float tokens
  CHECK_FALSE(first->forward(torch::zeros({2, 17}, torch::kLong)).ok());    // too long
  CHECK_FALSE(first->forward(torch::full({2, 8}, 256, torch::kLong)).ok()); // not a byte
  CHECK_FALSE(middle->forward(torch::zeros({2, 8, 31})).ok());              // wrong width
  CHECK_FALSE(middle->forward(torch::Tensor{}).ok());
  auto act = torch::zeros({2, 8, 32});
  CHECK_FALSE(middle->backward(act, torch::zeros({2, 8, 16})).ok());            // wrong grad shape
  CHECK_FALSE(last->forward(act).ok());                                         // no targets
  CHECK_FALSE(last->forward(act, torch::zeros({2, 7}, torch::kLong)).ok());     // wrong shape
  CHECK_FALSE(last->forward(act, torch::full({2, 8}, 300, torch::kLong)).ok()); // bad class
  CHECK(last->forward(act, tokens).ok());
  CHECK(first->forward(tokens).ok());
}

TEST_CASE("invalid model configs and stage ranges are failures") {
  auto cfg = small_gpt();
  CHECK_FALSE(make_gpt_stage(cfg, 2, 2).ok());
  CHECK_FALSE(make_gpt_stage(cfg, 4, 7).ok());
  cfg.heads = 5;
  CHECK_FALSE(make_gpt(cfg).ok());
  mlp_config m;
  m.width = 0;
  CHECK_FALSE(make_mlp(m).ok());
}

TEST_CASE("even stage ranges cover every block once") {
  auto r = must(even_stage_ranges(7, 3));
  REQUIRE(r.size() == 3);
  CHECK((r[0] == std::pair<int64_t, int64_t>{0, 3}));
  CHECK((r[1] == std::pair<int64_t, int64_t>{3, 5}));
  CHECK((r[2] == std::pair<int64_t, int64_t>{5, 7}));
  CHECK_FALSE(even_stage_ranges(2, 3).ok());
  CHECK_FALSE(even_stage_ranges(2, 0).ok());
}

TEST_CASE("with dropout, a seeded split equals the whole model and backward recomputes exactly") {
  auto cfg = small_gpt();
  cfg.dropout = 0.2;
  auto gen = seeded_generator(17);
  auto x = torch::randint(0, 256, {2, 16}, gen, torch::kLong);
  auto y = torch::randint(0, 256, {2, 16}, gen, torch::kLong);
  const uint64_t seed = 4242;
  auto whole = must(make_gpt(cfg));
  auto s0 = must(make_gpt_stage(cfg, 0, 3)), s1 = must(make_gpt_stage(cfg, 3, 6));

  auto whole_loss = whole->compute(x, y, seed);
  whole_loss.backward();
  auto act = must(s0->forward(x, {}, seed));
  auto loss = must(s1->forward(act, y, seed));
  CHECK(std::abs(loss.item<double>() - whole_loss.item<double>()) <= 1e-5);
  auto g1 = must(s1->backward(act, {}, y, seed));
  CHECK(g1.output.item<double>() == loss.item<double>()); // recomputed with the same masks
  must(s0->backward(x, g1.grad_input, {}, seed));
  std::map<std::string, torch::Tensor> expected = grads_by_name(*whole);
  for (auto* s : {s0.get(), s1.get()})
    for (auto& [name, g] : grads_by_name(*s))
      CHECK_MESSAGE(max_abs_diff(g, expected[name]) <= 1e-5, name);

  // Dropout is really on: another seed gives another loss; eval mode turns it off.
  CHECK(must(s1->forward(act, y, seed + 1)).item<double>() != loss.item<double>());
  auto plain = small_gpt();
  auto no_dropout = must(make_gpt(plain));
  whole->eval();
  CHECK(max_abs_diff(must(whole->forward(x, y, seed)), must(no_dropout->forward(x, y))) == 0.0);
}

} // namespace starling::test::kernels_stage_module_test
