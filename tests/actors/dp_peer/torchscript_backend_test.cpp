// The data-parallel peer's LibTorch backend on a TorchScript model (examples/torchscript's GPT,
// scripted by /usr/bin/python3 at test time) and a token file: gradients, averaged steps, state
// download and held-out evaluation go through the same flat vectors as for the built-in MLP.
#include <doctest/doctest.h>

#include "actors/dp_peer/backend.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/data/token_source.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/torchscript.hpp"
#include "support/python_fixtures.hpp"
#include "support/paths.hpp"

namespace starling::test::actors_torchscript_backend_test {

namespace dp = starling::actors::dp_peer;
namespace kernels = starling::kernels;

TEST_CASE("a data-parallel peer trains a TorchScript model on a token file and hands its state on") {
  auto dir = starling::testing::python_fixtures(
    STARLING_SOURCE_DIR + "/examples/torchscript/prepare.py",
    {"--layers", "2", "--width", "16", "--heads", "2", "--seq-len", "16", "--train-bytes", "20000",
     "--val-bytes", "4000"},
    {STARLING_SOURCE_DIR + "/examples/torchscript/prepare.py",
     STARLING_SOURCE_DIR + "/examples/torchscript/model.py"});
  kernels::torchscript_config ts;
  ts.files = {dir + "/whole.pt"};
  ts.vocab = 256;
  ts.seq_len = 16;
  kernels::token_source_options to;
  to.file.path = dir + "/train.bin";
  to.file.vocab_size = 256;
  to.seq_len = 16;
  auto train = kernels::token_source::make(to);
  REQUIRE(train.ok());
  to.file.path = dir + "/val.bin";
  auto eval = kernels::token_source::make(to);
  REQUIRE(eval.ok());

  auto make = [&](uint64_t stream) {
    dp::torch_backend_options o;
    o.spec = kernels::torchscript_model(ts);
    o.optimizer.lr = 3e-3;
    o.stream.seed = 1;
    o.stream.stream = stream;
    o.stream.microbatch = 8;
    o.eval_samples = 64;
    auto b = dp::make_torch_backend(o, *train, *eval);
    REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().what));
    return std::move(*b);
  };
  auto a = make(0);
  auto b = make(1);
  CHECK(a->describe().find("model 'torchscript'") != std::string::npos);
  CHECK(a->numel() == b->numel());
  CHECK(kernels::flatten_parameters(a->parameters()).equal(kernels::flatten_parameters(b->parameters())));
  auto before = a->evaluate();
  REQUIRE(before);
  CHECK(before->loss > 5.0); // about ln 256 at initialization

  // Collaborative steps: both accumulate, the mean of their gradients steps both.
  for (uint64_t step = 0; step < 12; ++step) {
    for (uint64_t i = 0; i < 2; ++i) {
      REQUIRE(a->compute(step * 2 + i).ok());
      REQUIRE(b->compute(step * 2 + i).ok());
    }
    auto ga = a->take();
    auto gb = b->take();
    CHECK(ga.samples == 16);
    auto mean = (ga.mean + gb.mean) / 2;
    REQUIRE(a->apply(mean));
    REQUIRE(b->apply(mean));
  }
  CHECK(kernels::flatten_parameters(a->parameters()).equal(kernels::flatten_parameters(b->parameters())));
  auto after = a->evaluate();
  REQUIRE(after);
  CHECK(after->loss < before->loss - 0.5);
  CHECK(after->accuracy > 0.0);

  // A newcomer downloads parameters and optimizer state, and then steps exactly like the donor.
  auto c = make(2);
  auto state = a->export_state(12);
  REQUIRE(state.ok());
  REQUIRE(c->import_state(*state));
  CHECK(kernels::flatten_parameters(c->parameters()).equal(kernels::flatten_parameters(a->parameters())));
  REQUIRE(a->compute(100).ok());
  auto g = a->take();
  REQUIRE(a->apply(g.mean));
  REQUIRE(c->apply(g.mean));
  CHECK(kernels::flatten_parameters(c->parameters()).equal(kernels::flatten_parameters(a->parameters())));
  // State averaging moves the same vector.
  auto v = a->state_vector();
  REQUIRE(v.ok());
  REQUIRE(b->load_state_vector(*v));
  CHECK(kernels::flatten_parameters(b->parameters()).equal(kernels::flatten_parameters(a->parameters())));
}

namespace {

/// The generated stand-in of Fashion-MNIST (the folder does not exist): 2000 training images and
/// `eval_items` held-out ones, as flat rows [B, 784].
using image_sources = std::pair<std::shared_ptr<const kernels::idx_source>,
                                std::shared_ptr<const kernels::idx_source>>;

image_sources stand_in_images(const std::string& dir, uint64_t eval_items) {
  kernels::idx_source_options io;
  io.dir = dir + "/no-such-folder";
  io.synthetic_when_absent = true;
  io.max_items = 2000;
  auto train = kernels::idx_source::load(io);
  REQUIRE(train.ok());
  io.train = false;
  io.max_items = eval_items;
  auto eval = kernels::idx_source::load(io);
  REQUIRE(eval.ok());
  return {*train, *eval};
}

} // namespace

TEST_CASE("a data-parallel peer trains a scripted CNN on images given as flat rows") {
  auto dir = starling::testing::python_fixtures(
    STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py", {"--channels", "4", "--seed", "1"},
    {STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py"});
  kernels::torchscript_config ts;
  ts.files = {dir + "/cnn.pt"};
  ts.vocab = 10;
  ts.input_shape = {1, 28, 28};
  auto images = stand_in_images(dir, 500);
  auto& train = images.first;
  auto& eval = images.second;
  dp::torch_backend_options o;
  o.spec = kernels::torchscript_model(ts);
  o.optimizer.kind = "adam";
  o.optimizer.lr = 3e-3;
  o.stream.seed = 2;
  o.stream.microbatch = 32;
  o.eval_samples = 500;
  auto b = dp::make_torch_backend(o, train, eval);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().what));
  auto& peer = **b;
  auto before = peer.evaluate();
  REQUIRE(before);
  CHECK(before->loss > 1.5); // about ln 10 at initialization
  for (uint64_t step = 0; step < 30; ++step) {
    REQUIRE(peer.compute(step).ok());
    auto g = peer.take();
    REQUIRE(peer.apply(g.mean));
  }
  auto after = peer.evaluate();
  REQUIRE(after);
  INFO("held-out loss " << before->loss << " -> " << after->loss << ", accuracy "
                        << after->accuracy);
  CHECK(after->loss < before->loss - 0.5);
  CHECK(after->accuracy > 0.5);
  // A model whose input_shape does not match its first layer is refused at loading, naming
  // the file.
  ts.input_shape = {784};
  dp::torch_backend_options bad = o;
  bad.spec = kernels::torchscript_model(ts);
  auto refused = dp::make_torch_backend(bad, train, eval);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().what.find("cnn.pt") != std::string::npos);
}

namespace {

/// The float buffers (running statistics) of a backend's model, flat.
torch::Tensor float_buffers(dp::backend& b) {
  return kernels::flatten_parameters(kernels::split_buffers(b.module()->buffers(true)).floats);
}

} // namespace

TEST_CASE("data-parallel peers train a CNN with batch norm and dropout; a state round leaves "
          "equal parameters and running statistics") {
  auto dir = starling::testing::python_fixtures(
    STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py",
    {"--channels", "4", "--seed", "1", "--norm"},
    {STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py"});
  kernels::torchscript_config ts;
  ts.files = {dir + "/cnn_bn.pt"};
  ts.vocab = 10;
  ts.input_shape = {1, 28, 28};
  auto images = stand_in_images(dir, 300);
  auto& train = images.first;
  auto& eval = images.second;
  auto make = [&](uint64_t stream) {
    dp::torch_backend_options o;
    o.spec = kernels::torchscript_model(ts);
    o.optimizer.kind = "adam";
    o.optimizer.lr = 3e-3;
    o.stream.seed = 2;
    o.stream.stream = stream;
    o.stream.microbatch = 32;
    o.eval_samples = 300;
    auto b = dp::make_torch_backend(o, train, eval);
    REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().what));
    return std::move(*b);
  };
  auto a = make(0);
  auto b = make(1);
  // Two BatchNorm2d layers of 4 and 8 channels: running mean and variance of each (24 floats)
  // and two counters.
  CHECK(float_buffers(*a).numel() == 24);
  auto before = a->evaluate();
  REQUIRE(before);
  // Evaluation is in evaluation mode: deterministic (no dropout), running statistics untouched,
  // and training mode is back afterwards.
  auto stats = float_buffers(*a);
  auto again = a->evaluate();
  REQUIRE(again);
  CHECK(again->loss == before->loss);
  CHECK(float_buffers(*a).equal(stats));
  CHECK(a->module()->is_training());

  for (uint64_t step = 0; step < 20; ++step) {
    REQUIRE(a->compute(step).ok());
    REQUIRE(b->compute(step).ok());
    auto ga = a->take();
    auto gb = b->take();
    auto mean = (ga.mean + gb.mean) / 2;
    REQUIRE(a->apply(mean));
    REQUIRE(b->apply(mean));
  }
  CHECK(kernels::flatten_parameters(a->parameters())
          .equal(kernels::flatten_parameters(b->parameters())));
  // Each peer's running statistics followed its own microbatches.
  auto own_a = float_buffers(*a);
  auto own_b = float_buffers(*b);
  CHECK_FALSE(own_a.equal(own_b));
  auto after = a->evaluate();
  REQUIRE(after);
  INFO("held-out loss " << before->loss << " -> " << after->loss << ", accuracy "
                        << after->accuracy);
  CHECK(after->loss < before->loss - 0.3);

  // A state round averages the whole state vector, running statistics included.
  auto va = a->state_vector();
  auto vb = b->state_vector();
  REQUIRE((va.ok() && vb.ok()));
  CHECK(va->numel() == 3 * a->numel() + 24);
  auto avg = (*va + *vb) / 2;
  REQUIRE(a->load_state_vector(avg));
  REQUIRE(b->load_state_vector(avg));
  CHECK(kernels::flatten_parameters(a->parameters())
          .equal(kernels::flatten_parameters(b->parameters())));
  CHECK(float_buffers(*a).equal(float_buffers(*b)));
  CHECK(torch::allclose(float_buffers(*a), (own_a + own_b) / 2));

  // A newcomer downloads parameters, moments and buffers (the counters from the donor).
  auto c = make(2);
  auto state = a->export_state(20);
  REQUIRE(state.ok());
  REQUIRE(state->int_buffers.tensor.defined());
  CHECK(state->int_buffers.tensor.equal(torch::full({2}, 20, torch::kLong)));
  REQUIRE(c->import_state(*state));
  CHECK(float_buffers(*c).equal(float_buffers(*a)));
  auto counters = [](dp::backend& p) {
    return kernels::flatten_integers(kernels::split_buffers(p.module()->buffers(true)).integers);
  };
  CHECK(counters(*c).equal(counters(*a)));
  auto ec = c->evaluate();
  REQUIRE(ec);
  CHECK(ec->loss == a->evaluate()->loss);
  // A state without the buffers (a peer of an older layout) is refused, changing nothing.
  auto stripped = *state;
  stripped.buffers = {};
  stripped.int_buffers = {};
  auto d = make(3);
  auto initial = kernels::flatten_parameters(d->parameters());
  auto refused = d->import_state(stripped);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.what().find("the state carries 0 float and 0 integer buffer elements, the model "
                            "has 24 and 2")
        != std::string::npos);
  CHECK(kernels::flatten_parameters(d->parameters()).equal(initial));
}

} // namespace starling::test::actors_torchscript_backend_test
