// TorchScript models: the GPT of examples/torchscript/model.py, scripted by /usr/bin/python3 at
// test time (tests/support/ts_fixtures.py), against the built-in GPT; loading errors; export.
#include "kernels/models/gpt.hpp"
#include "kernels/models/registry.hpp"
#include "kernels/models/torchscript.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include <torch/script.h>

#include <unistd.h>

#include "support/python_fixtures.hpp"
#include "support/paths.hpp"

namespace starling::test::kernels_torchscript_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

template <class T>
T must(starling::result<T> r) {
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  return std::move(r).value();
}

/// A directory removed with the process's statics.
struct owned_dir {
  std::string path;
  ~owned_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// The fixtures of tests/support/ts_fixtures.py, written once per build.
const std::string& fixtures() {
  static const std::string dir = starling::testing::python_fixtures(
    STARLING_SOURCE_DIR + "/tests/support/ts_fixtures.py", {},
    {STARLING_SOURCE_DIR + "/tests/support/ts_fixtures.py",
     STARLING_SOURCE_DIR + "/examples/torchscript/model.py"});
  return dir;
}

/// This process's own scratch folder (the fixtures are shared: never written).
const std::string& scratch() {
  static const owned_dir dir{[] {
    char tmpl[] = "/tmp/starling-ts-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    return std::string{tmpl};
  }()};
  return dir.path;
}

std::string fx(const std::string& name) {
  return fixtures() + "/" + name;
}

torchscript_config config(std::vector<std::string> names) {
  torchscript_config c;
  for (auto& n : names)
    c.files.push_back(fx(n));
  c.vocab = 32;
  c.seq_len = 8;
  return c;
}

gpt_config builtin() {
  gpt_config g;
  g.vocab = 32;
  g.width = 16;
  g.heads = 2;
  g.seq_len = 8;
  g.layers = 4;
  return g;
}

/// The built-in name of scripted parameter `key` of file `file` whose first block is `offset`.
std::string builtin_name(const std::string& key, int64_t file, int64_t offset) {
  auto prefix = "block" + std::to_string(file) + ".";
  REQUIRE(key.rfind(prefix, 0) == 0);
  auto rest = key.substr(prefix.size());
  std::smatch m;
  if (rest.rfind("embed.", 0) == 0)
    return "input." + rest.substr(6);
  if (std::regex_match(rest, m, std::regex{R"(blocks\.([0-9]+)\.(.*))"}))
    return "block" + std::to_string(offset + std::stoll(m[1])) + "." + m[2].str();
  return rest;
}

/// Copies the scripted stages' parameters into the built-in ones; returns the name map.
std::map<std::string, std::string> copy_into(const std::vector<std::shared_ptr<stage_module>>& ts,
                                             const std::vector<int64_t>& offsets,
                                             const std::vector<std::shared_ptr<stage_module>>& bi) {
  std::map<std::string, torch::Tensor> target;
  for (auto& s : bi)
    for (auto& kv : s->named_parameters(true))
      target.emplace(kv.key(), kv.value());
  std::map<std::string, std::string> names;
  torch::NoGradGuard guard;
  for (size_t k = 0; k < ts.size(); ++k)
    for (auto& kv : ts[k]->named_parameters(true)) {
      auto name = builtin_name(kv.key(), static_cast<int64_t>(k), offsets[k]);
      REQUIRE_MESSAGE(target.count(name), name);
      target[name].copy_(kv.value());
      names[kv.key() + "@" + std::to_string(k)] = name;
    }
  CHECK(names.size() == target.size());
  return names;
}

/// forward then backward through `stages` as a trainer drives them; returns the loss.
double pipeline_step(std::vector<std::shared_ptr<stage_module>>& stages, const torch::Tensor& x,
                     const torch::Tensor& y) {
  std::vector<torch::Tensor> inputs{x};
  for (size_t i = 0; i + 1 < stages.size(); ++i)
    inputs.push_back(must(stages[i]->forward(inputs.back())));
  auto loss = must(stages.back()->forward(inputs.back(), y)).item<double>();
  torch::Tensor grad;
  for (size_t i = stages.size(); i-- > 0;) {
    auto g = must(stages[i]->backward(inputs[i], grad, i + 1 == stages.size() ? y : torch::Tensor{}));
    CHECK(std::abs((i + 1 == stages.size() ? g.output.item<double>() : loss) - loss) < 1e-6);
    grad = g.grad_input;
  }
  return loss;
}

std::pair<torch::Tensor, torch::Tensor> batch(int64_t b = 3) {
  auto gen = seeded_generator(11);
  auto w = torch::randint(0, 32, {b, 9}, gen, torch::kLong);
  return {w.narrow(1, 0, 8).contiguous(), w.narrow(1, 1, 8).contiguous()};
}

/// Compares every scripted gradient with the built-in one of the same parameter.
void check_gradients(const std::vector<std::shared_ptr<stage_module>>& ts,
                     const std::vector<std::shared_ptr<stage_module>>& bi,
                     const std::map<std::string, std::string>& names) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& s : bi)
    for (auto& kv : s->named_parameters(true))
      grads.emplace(kv.key(), kv.value().grad());
  double worst = 0;
  for (size_t k = 0; k < ts.size(); ++k)
    for (auto& kv : ts[k]->named_parameters(true)) {
      auto& name = names.at(kv.key() + "@" + std::to_string(k));
      REQUIRE(kv.value().grad().defined());
      REQUIRE(grads.at(name).defined());
      worst = std::max(worst, (kv.value().grad() - grads.at(name)).abs().max().item<double>());
    }
  CHECK(worst < 1e-5);
}

std::string error_of(const torchscript_config& c) {
  auto r = inspect_torchscript(c);
  REQUIRE_FALSE(r.ok());
  return r.error().what;
}

} // namespace

TEST_CASE("a scripted GPT in two stages gives the built-in GPT's loss and gradients") {
  auto cfg = config({"gpt_s0.pt", "gpt_s1.pt"});
  std::vector<std::shared_ptr<stage_module>> ts{must(make_torchscript_stage(cfg, 0, 1)),
                                                must(make_torchscript_stage(cfg, 1, 2))};
  std::vector<std::shared_ptr<stage_module>> bi{must(make_gpt_stage(builtin(), 0, 2)),
                                                must(make_gpt_stage(builtin(), 2, 4))};
  auto names = copy_into(ts, {0, 2}, bi);
  auto [x, y] = batch();
  auto l_ts = pipeline_step(ts, x, y);
  auto l_bi = pipeline_step(bi, x, y);
  CHECK(std::abs(l_ts - l_bi) < 1e-5);
  CHECK(l_ts > 3.0); // about ln 32 = 3.47 at initialization: a real loss, not a constant
  check_gradients(ts, bi, names);
}

TEST_CASE("a scripted GPT as one file gives the built-in GPT's loss and gradients") {
  auto cfg = config({"gpt_whole.pt"});
  auto reg = model_registry::builtins();
  std::vector<std::shared_ptr<stage_module>> ts{
    must(reg->make_stage(torchscript_model(cfg), 0, 1))};
  std::vector<std::shared_ptr<stage_module>> bi{must(make_gpt(builtin()))};
  auto names = copy_into(ts, {0}, bi);
  auto [x, y] = batch();
  auto l_ts = ts[0]->compute(x, y);
  auto l_bi = bi[0]->compute(x, y);
  l_ts.backward();
  l_bi.backward();
  CHECK(std::abs(l_ts.item<double>() - l_bi.item<double>()) < 1e-5);
  check_gradients(ts, bi, names);
  // The registry knows the scripted model's boundaries and targets.
  auto in = must(reg->boundary(torchscript_model(cfg), 0, 5));
  CHECK(in.sizes == std::vector<int64_t>{5, 8});
  CHECK((in.dtype == torch::kLong));
  CHECK(must(reg->targets(torchscript_model(cfg), 5)).sizes == std::vector<int64_t>{5, 8});
}

TEST_CASE("loading a scripted model reports each mismatch naming the file") {
  auto layout = must(inspect_torchscript(config({"gpt_s0.pt", "gpt_s1.pt"})));
  REQUIRE(layout.inputs.size() == 2);
  CHECK(layout.inputs[1].sizes == std::vector<int64_t>{2, 8, 16});
  CHECK(layout.output.sizes == std::vector<int64_t>{2, 8, 32});

  auto missing = error_of(config({"gpt_s0.pt", "nowhere.pt"}));
  CHECK(missing.find("nowhere.pt: no such file") != std::string::npos);

  auto bad = scratch() + "/corrupt.pt";
  {
    std::ifstream in{fx("gpt_s1.pt"), std::ios::binary};
    std::string bytes{std::istreambuf_iterator<char>{in}, {}};
    std::ofstream out{bad, std::ios::binary};
    out << bytes.substr(0, bytes.size() / 2); // truncated: the zip directory is gone
  }
  auto with_bad = config({"gpt_s0.pt", "gpt_s1.pt"});
  with_bad.files[1] = bad;
  auto corrupt = error_of(with_bad);
  CHECK(corrupt.find("corrupt.pt: not a loadable TorchScript file") != std::string::npos);

  auto boundary = error_of(config({"gpt_s0.pt", "wide.pt"}));
  CHECK(boundary.find("wide.pt: does not accept the output of") != std::string::npos);
  CHECK(boundary.find("gpt_s0.pt (Float [2, 8, 16])") != std::string::npos);

  // A plain nn.Dropout is accepted: its masks come from the seeded default generator.
  CHECK(inspect_torchscript(config({"dropout.pt", "gpt_s1.pt"})).ok());

  auto vocab = error_of(config({"small_vocab.pt", "gpt_s1.pt"}));
  CHECK(vocab.find("small_vocab.pt: does not accept the model's input, tokens with ids up to 31")
        != std::string::npos);

  auto wider = config({"gpt_s0.pt", "gpt_s1.pt"});
  wider.vocab = 20; // ids fit the embedding, but the head has 32 logits
  auto head = error_of(wider);
  CHECK(head.find("gpt_s1.pt: returns Float [2, 8, 32]; the cross_entropy loss needs float "
                  "[2, 8, 20]")
        != std::string::npos);

  // Untrusted input at run time: out-of-vocabulary tokens and a wrong boundary.
  auto cfg = config({"gpt_s0.pt", "gpt_s1.pt"});
  auto s0 = must(make_torchscript_stage(cfg, 0, 1));
  auto oov = s0->forward(torch::full({2, 8}, 40, torch::kLong));
  REQUIRE_FALSE(oov.ok());
  CHECK(oov.error().what.find("gpt_s0.pt: token ids must lie in [0, 32)") != std::string::npos);
  auto s1 = must(make_torchscript_stage(cfg, 1, 2));
  auto shape = s1->forward(torch::zeros({2, 8, 24}), torch::zeros({2, 8}, torch::kLong));
  REQUIRE_FALSE(shape.ok());
  CHECK(shape.error().what.find("gpt_s1.pt: expects Float [B, 8, 16]") != std::string::npos);
  auto targets = s1->forward(torch::zeros({2, 8, 16}), torch::full({2, 8}, 32, torch::kLong));
  REQUIRE_FALSE(targets.ok());
  CHECK(targets.error().what.find("target ids must lie in [0, 32)") != std::string::npos);
}

TEST_CASE("a scripted loss and MSE train a scripted model") {
  auto ce = config({"gpt_whole.pt"});
  auto scripted = ce;
  scripted.loss = loss_kind::scripted;
  scripted.loss_file = fx("ce_loss.pt");
  auto [x, y] = batch();
  auto a = must(make_torchscript_stage(ce, 0, 1));
  auto b = must(make_torchscript_stage(scripted, 0, 1));
  CHECK(std::abs(must(a->forward(x, y)).item<double>() - must(b->forward(x, y)).item<double>())
        < 1e-6);
  auto mse = ce;
  mse.loss = loss_kind::mse;
  auto m = must(make_torchscript_stage(mse, 0, 1));
  auto g = must(m->backward(x, {}, y));
  CHECK(g.output.item<double>() > 0);
  CHECK(m->ordered_parameters().front().grad().abs().sum().item<double>() > 0);

  auto wrong = ce;
  wrong.loss = loss_kind::scripted;
  wrong.loss_file = fx("gpt_s1.pt"); // forward takes one tensor, not (output, targets)
  CHECK(error_of(wrong).find("gpt_s1.pt: forward must take (output: Tensor, targets: Tensor)")
        != std::string::npos);
}

TEST_CASE("trained parameters of a scripted stage export as TorchScript and as a state dict") {
  auto cfg = config({"gpt_s0.pt", "gpt_s1.pt"});
  auto s1 = must(make_torchscript_stage(cfg, 1, 2));
  {
    // A step on the stage's parameter list reaches the scripted module.
    torch::NoGradGuard guard;
    for (auto& p : s1->ordered_parameters())
      p.add_(0.01);
  }
  auto x = torch::randn({2, 8, 16}, seeded_generator(5));
  auto y = batch(2).second;
  auto trained = must(s1->forward(x, y)).item<double>();
  auto dir = scratch() + "/export";
  auto files = must(export_stage(*s1, 1, dir));
  REQUIRE(files.torchscript == std::vector<std::string>{dir + "/gpt_s1.pt"});
  REQUIRE(files.state_dicts == std::vector<std::string>{dir + "/gpt_s1.state_dict.pt"});
  auto again = config({"gpt_s0.pt", "gpt_s1.pt"});
  again.files[1] = files.torchscript[0];
  auto reloaded = must(make_torchscript_stage(again, 1, 2));
  CHECK(must(reloaded->forward(x, y)).item<double>() == doctest::Approx(trained).epsilon(1e-7));
  auto sd = must(load_state_dict(files.state_dicts[0]));
  auto params = s1->named_parameters(true);
  REQUIRE(sd.size() == params.size());
  for (auto& [name, t] : sd) {
    auto* p = params.find("block1." + name);
    REQUIRE_MESSAGE(p, name);
    CHECK(t.equal(*p));
  }
  // A built-in stage exports a state dict under the whole model's names.
  auto bi = must(make_gpt_stage(builtin(), 2, 4));
  auto bfiles = must(export_stage(*bi, 1, dir));
  CHECK(bfiles.torchscript.empty());
  auto bsd = must(load_state_dict(bfiles.state_dicts.at(0)));
  CHECK(bsd.front().first == "block2.ln1.weight");
}

TEST_CASE("a scripted stage starts from its files' values: loading's checks leave its buffers "
          "untouched") {
  // counting.pt adds 1 to its buffer `calls` on every training-mode forward; loading runs every
  // file's forward twice to check determinism, on a copy of the module the stage keeps.
  auto cfg = config({"gpt_s0.pt", "gpt_s1.pt", "counting.pt"});
  auto stage = must(make_torchscript_stage(cfg, 2, 3));
  auto calls = [&] {
    auto dir = scratch() + "/counting";
    auto files = must(export_stage(*stage, 2, dir));
    for (auto& [name, t] : must(load_state_dict(files.state_dicts.at(0))))
      if (name == "calls")
        return t.item<double>();
    FAIL("no buffer 'calls' in the exported state dict");
    return -1.0;
  };
  CHECK(calls() == 0);
  auto x = torch::randn({2, 8, 32}, seeded_generator(5));
  must(stage->forward(x, batch(2).second));
  CHECK(calls() == 1);
}

TEST_CASE("a stage with a plain nn.Dropout recomputes the same activations: the default "
          "generator is seeded from the microbatch's seed under one lock") {
  auto cfg = config({"dropout.pt", "gpt_s1.pt"});
  auto s0 = must(make_torchscript_stage(cfg, 0, 1));
  auto x = batch(2).first;
  auto out = must(s0->forward(x, {}, 5));
  // Dropout is on in training mode: p = 0.5 zeroes about half of the activations.
  auto zeros = out.eq(0).to(torch::kDouble).mean().item<double>();
  CHECK(zeros > 0.3);
  CHECK(zeros < 0.7);
  CHECK_FALSE(must(s0->forward(x, {}, 6)).equal(out)); // another microbatch, other masks
  // The recomputation in backward draws the same masks.
  auto g = must(s0->backward(x, torch::ones_like(out), {}, 5));
  CHECK((g.output - out).abs().max().item<double>() < 1e-6);
  CHECK(g.output.eq(0).equal(out.eq(0)));
  // The default generator is left as it was found: code drawing from it sees no difference.
  torch::manual_seed(3);
  auto a = torch::rand({4});
  torch::manual_seed(3);
  must(s0->forward(x, {}, 5));
  CHECK(torch::rand({4}).equal(a));
  // Forwards from several threads (actors) are serialized: each gets its own seed's masks.
  auto s1 = must(make_torchscript_stage(cfg, 0, 1));
  auto other = must(s1->forward(x, {}, 6));
  std::vector<int> wrong(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto r = t == 0 ? s0->forward(x, {}, 5) : s1->forward(x, {}, 6);
        if (!r.ok() || !r.value().equal(t == 0 ? out : other))
          ++wrong[t];
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(wrong == std::vector<int>{0, 0});
  // Evaluation mode: no dropout, whatever the seed.
  s0->eval();
  auto e5 = must(s0->forward(x, {}, 5));
  CHECK(e5.equal(must(s0->forward(x, {}, 6))));
  CHECK(e5.eq(0).sum().item<int64_t>() == 0);
}

TEST_CASE("batch norm in a stage: the forward updates the running statistics once, the "
          "recomputation puts back what it found, export saves evaluation mode") {
  auto cfg = config({"gpt_s0.pt", "gpt_s1.pt", "bn_dropout.pt"});
  auto stage = must(make_torchscript_stage(cfg, 2, 3));
  auto buffers = stage->named_buffers(true);
  REQUIRE(buffers.find("block2.norm.running_mean") != nullptr);
  REQUIRE(buffers.find("block2.norm.num_batches_tracked") != nullptr);
  auto mean = *buffers.find("block2.norm.running_mean");
  auto count = *buffers.find("block2.norm.num_batches_tracked");
  // Loading's probes left the file's values.
  CHECK(mean.abs().sum().item<double>() == 0);
  CHECK(count.item<int64_t>() == 0);
  auto x = torch::randn({2, 8, 32}, seeded_generator(5)) * 3 + 1;
  auto y = batch(2).second;
  auto loss = must(stage->forward(x, y, 9)).item<double>();
  auto after_forward = mean.clone();
  CHECK(after_forward.abs().sum().item<double>() > 0);
  CHECK(count.item<int64_t>() == 1);
  auto g = must(stage->backward(x, {}, y, 9));
  CHECK(g.output.item<double>() == doctest::Approx(loss).epsilon(1e-7)); // same masks
  CHECK(mean.equal(after_forward));
  CHECK(count.item<int64_t>() == 1);
  CHECK(stage->ordered_parameters().back().grad().abs().sum().item<double>() > 0);
  // Export: evaluation mode in the file (dropout off, running statistics used); the stage
  // itself goes on training.
  auto files = must(export_stage(*stage, 2, scratch() + "/bn"));
  auto saved = torch::jit::load(files.torchscript.at(0));
  CHECK_FALSE(saved.is_training());
  CHECK(stage->is_training());
  auto sd = must(load_state_dict(files.state_dicts.at(0)));
  bool has_mean = false;
  for (auto& [name, t] : sd)
    if (name == "norm.running_mean") {
      has_mean = true;
      CHECK(t.equal(after_forward));
    }
  CHECK(has_mean);
}

TEST_CASE("a module nondeterministic for another reason than dropout is still refused") {
  // drifting.pt adds a counter its forward increments to its output: a recomputation would see
  // another value than the forward did.
  auto drifting = error_of(config({"gpt_s0.pt", "gpt_s1.pt", "drifting.pt"}));
  CHECK(drifting.find("drifting.pt: not deterministic") != std::string::npos);
}

} // namespace starling::test::kernels_torchscript_test
