#include "kernels/models/registry.hpp"

#include <doctest/doctest.h>

namespace starling::test::kernels_registry_test {

using namespace starling::kernels;

namespace {

gpt_config tiny_gpt() {
  gpt_config c;
  c.layers = 3;
  c.width = 16;
  c.heads = 2;
  c.seq_len = 8;
  c.seed = 5;
  return c;
}

mlp_config tiny_mlp() {
  mlp_config c;
  c.inputs = 6;
  c.width = 10;
  c.layers = 2;
  c.classes = 3;
  return c;
}

} // namespace

TEST_CASE("the built-in registry builds GPT and MLP stages by name, with the shapes at their "
          "boundaries") {
  auto reg = model_registry::builtins();
  CHECK(reg->names() == std::vector<std::string>{"gpt", "mlp", "torchscript"});
  auto gpt = gpt_model(tiny_gpt());
  REQUIRE(reg->depth(gpt).ok());
  CHECK(*reg->depth(gpt) == 3);
  // A stage of blocks [1, 3) takes the activations entering block 1 and ends with the loss.
  auto mid = reg->make_stage(gpt, 1, 3);
  REQUIRE(mid.ok());
  CHECK(!(*mid)->is_first());
  CHECK((*mid)->is_last());
  auto in = reg->boundary(gpt, 1, 4);
  REQUIRE(in.ok());
  CHECK(in->sizes == std::vector<int64_t>{4, 8, 16});
  CHECK((in->dtype == torch::kFloat));
  auto t = reg->targets(gpt, 4);
  REQUIRE(t.ok());
  auto loss = (*mid)->forward(torch::zeros(in->sizes, in->dtype), torch::zeros(t->sizes, t->dtype));
  REQUIRE(loss.ok());
  CHECK(loss->dim() == 0);
  // The first stage takes bytes.
  auto tokens = reg->boundary(gpt, 0, 4);
  REQUIRE(tokens.ok());
  CHECK((tokens->dtype == torch::kLong));
  auto first = reg->make_stage(gpt, 0, 1);
  REQUIRE(first.ok());
  auto act = (*first)->forward(torch::zeros(tokens->sizes, tokens->dtype));
  REQUIRE(act.ok());
  CHECK(act->sizes().vec() == in->sizes);
  // The same layers from the registry and from the GPT's own factory have the same parameters.
  auto direct = make_gpt_stage(tiny_gpt(), 1, 3);
  REQUIRE(direct.ok());
  auto a = (*mid)->ordered_parameters();
  auto b = (*direct)->ordered_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    CHECK(torch::equal(a[i], b[i]));
  // The MLP: features in, activations between blocks, one label per sample.
  auto mlp = mlp_model(tiny_mlp());
  CHECK(*reg->depth(mlp) == 2);
  CHECK(reg->boundary(mlp, 0, 5)->sizes == std::vector<int64_t>{5, 6});
  CHECK(reg->boundary(mlp, 1, 5)->sizes == std::vector<int64_t>{5, 10});
  CHECK(reg->targets(mlp, 5)->sizes == std::vector<int64_t>{5});
  auto whole = reg->make_stage(mlp, 0, 2);
  REQUIRE(whole.ok());
  CHECK((*whole)->forward(torch::zeros({5, 6}), torch::zeros({5}, torch::kLong)).ok());
}

TEST_CASE("the registry names what is wrong: an unknown model, options of another model, a "
          "range outside the model, a name taken twice") {
  auto reg = model_registry::builtins();
  auto unknown = reg->depth(model_spec{"resnet", tiny_gpt()});
  REQUIRE(!unknown.ok());
  CHECK(unknown.error().what.find("unknown model 'resnet'") != std::string::npos);
  CHECK(unknown.error().what.find("gpt, mlp") != std::string::npos);
  auto mixed = reg->make_stage(model_spec{"gpt", tiny_mlp()}, 0, 1);
  REQUIRE(!mixed.ok());
  CHECK(mixed.error().what.find("model 'gpt' expects its own options type") != std::string::npos);
  auto outside = reg->make_stage(gpt_model(tiny_gpt()), 2, 4);
  REQUIRE(!outside.ok());
  CHECK(outside.error().what.find("cannot hold [2, 4)") != std::string::npos);
  CHECK(!reg->boundary(gpt_model(tiny_gpt()), 3, 4).ok()); // blocks are 0, 1, 2
  auto bad = tiny_gpt();
  bad.heads = 3; // does not divide the width
  CHECK(!reg->depth(gpt_model(bad)).ok());
  model_registry mine;
  CHECK(mine.add("empty", model_entry{}).what().find("needs depth") != std::string::npos);
}

TEST_CASE("a program registers its own model in a registry of its own") {
  model_registry mine;
  struct two_mlps {
    mlp_config inner;
  };
  auto entry = make_model_entry<two_mlps>(
    "mine", [](const two_mlps& o) -> starling::result<int64_t> { return o.inner.layers; },
    [](const two_mlps& o, int64_t b, int64_t e) { return make_mlp_stage(o.inner, b, e); },
    [](const two_mlps& o, int64_t, int64_t batch) -> starling::result<tensor_shape> {
      return tensor_shape{{batch, o.inner.inputs}, torch::kFloat};
    },
    [](const two_mlps&, int64_t batch) -> starling::result<tensor_shape> {
      return tensor_shape{{batch}, torch::kLong};
    });
  REQUIRE(mine.add("mine", entry).ok());
  CHECK(!mine.add("mine", entry).ok()); // taken
  CHECK(mine.has("mine"));
  CHECK(!model_registry::builtins()->has("mine")); // the built-ins stay as they were
  auto stage = mine.make_stage(model_spec{"mine", two_mlps{tiny_mlp()}}, 0, 1);
  REQUIRE(stage.ok());
  CHECK((*stage)->is_first());
  CHECK(!(*stage)->is_last());
}

} // namespace starling::test::kernels_registry_test
