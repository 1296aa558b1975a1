#include "kernels/t2i/sampler.hpp"

#include <doctest/doctest.h>

#include "kernels/models/gpt.hpp"
#include "kernels/models/stage_module.hpp"

namespace starling::test::kernels_t2i_sampler_test {

using namespace starling::kernels;

namespace {

std::shared_ptr<stage_module> tiny_gpt(const t2i_layout& layout, uint64_t seed) {
  gpt_config cfg;
  cfg.vocab = layout.vocab();
  cfg.layers = 1;
  cfg.width = 16;
  cfg.heads = 2;
  cfg.seq_len = layout.sequence_length() - 1;
  cfg.seed = seed;
  auto m = make_gpt(cfg);
  REQUIRE(m.ok());
  return *m;
}

} // namespace

TEST_CASE("an untrained GPT samples image tokens of the right shape, the same for a seed") {
  t2i_layout layout{32, 49};
  auto gpt = tiny_gpt(layout, 3);
  sampling_options o;
  o.seed = 11;
  auto a = sample_image_tokens(*gpt, layout, "a photo of an ankle boot", 3, o);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().what));
  CHECK(a->size() == 3 * 49);
  for (auto t : *a)
    CHECK((t >= 0 && t < 32));
  auto b = sample_image_tokens(*gpt, layout, "a photo of an ankle boot", 3, o);
  REQUIRE(b.ok());
  CHECK(*a == *b);
  o.seed = 12;
  auto c = sample_image_tokens(*gpt, layout, "a photo of an ankle boot", 3, o);
  REQUIRE(c.ok());
  CHECK(*a != *c);

  // Top-1 and temperature 0 both pick the most likely token: the same tokens, whatever the seed.
  o.top_k = 1;
  auto top1 = sample_image_tokens(*gpt, layout, "a bag", 2, o);
  sampling_options greedy;
  greedy.temperature = 0;
  auto g = sample_image_tokens(*gpt, layout, "a bag", 2, greedy);
  REQUIRE(top1.ok());
  REQUIRE(g.ok());
  CHECK(*top1 == *g);
  CHECK(std::vector<int64_t>(g->begin(), g->begin() + 49) ==
        std::vector<int64_t>(g->begin() + 49, g->end()));
}

TEST_CASE("sampling refuses a mismatched model, a bad caption and bad options") {
  t2i_layout layout{32, 49};
  auto gpt = tiny_gpt(layout, 3);
  sampling_options o;
  CHECK_FALSE(sample_image_tokens(*gpt, layout, "a photo of a zebra", 1, o).ok());
  CHECK_FALSE(sample_image_tokens(*gpt, layout, "a bag", 0, o).ok());
  o.temperature = -1;
  CHECK_FALSE(sample_image_tokens(*gpt, layout, "a bag", 1, o).ok());
  o = {};
  o.top_k = -2;
  CHECK_FALSE(sample_image_tokens(*gpt, layout, "a bag", 1, o).ok());
  o = {};
  t2i_layout bigger{64, 49}; // vocabulary larger than the model's
  auto r = sample_image_tokens(*gpt, bigger, "a bag", 1, o);
  REQUIRE_FALSE(r.ok());
  t2i_layout longer{32, 60}; // more tokens than the model's sequence length
  CHECK_FALSE(sample_image_tokens(*gpt, longer, "a bag", 1, o).ok());
}

TEST_CASE("the image loss counts the image positions only and checks its targets") {
  t2i_layout layout{32, 49};
  auto gpt = tiny_gpt(layout, 5);
  auto seq = joint_sequence(layout, "a coat", std::vector<int64_t>(49, 7));
  REQUIRE(seq.ok());
  auto full = torch::tensor(*seq, torch::kLong).unsqueeze(0).repeat({2, 1});
  auto input = full.slice(1, 0, -1), targets = full.slice(1, 1);
  auto whole = gpt->forward(input, targets);
  REQUIRE(whole.ok());
  use_image_loss(*gpt, layout);
  auto image = gpt->forward(input, targets);
  REQUIRE(image.ok());
  {
    torch::NoGradGuard no_grad;
    auto logits = gpt->predict(input);
    auto expected = mean_cross_entropy(logits.slice(1, 8), targets.slice(1, 8));
    CHECK(image->item<double>() == doctest::Approx(expected.item<double>()));
  }
  CHECK(image->item<double>() != doctest::Approx(whole->item<double>()));
  // Changing a caption target does not change the image loss.
  auto other = targets.clone();
  other[0][0] = layout.padding();
  CHECK(gpt->forward(input, other)->item<double>() == doctest::Approx(image->item<double>()));
  CHECK_FALSE(gpt->forward(input, targets.slice(1, 1)).ok());
  CHECK_FALSE(gpt->forward(input, targets.to(torch::kInt)).ok());
  auto high = targets.clone();
  high[1][5] = layout.vocab();
  CHECK_FALSE(gpt->forward(input, high).ok());
  // It trains: one step of the image loss's gradient lowers it.
  auto grads = gpt->backward(input, {}, targets);
  REQUIRE(grads.ok());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : gpt->parameters())
      if (p.grad().defined())
        p.sub_(p.grad(), 0.5);
  }
  CHECK(gpt->forward(input, targets)->item<double>() < image->item<double>());
}

TEST_CASE("several captions sampled in one batch: greedy tokens equal each caption's own") {
  t2i_layout layout{32, 49};
  auto gpt = tiny_gpt(layout, 5);
  sampling_options greedy;
  greedy.temperature = 0;
  std::vector<std::string> captions = {"a bag", "a photo of an ankle boot", "a coat"};
  auto all = sample_captions(*gpt, layout, captions, 2, greedy);
  REQUIRE_MESSAGE(all.ok(), (all.ok() ? "" : all.error().what));
  REQUIRE(all->size() == 3);
  for (std::size_t c = 0; c < captions.size(); ++c) {
    CAPTURE(captions[c]);
    auto one = sample_image_tokens(*gpt, layout, captions[c], 2, greedy);
    REQUIRE(one.ok());
    CHECK((*all)[c] == *one);
  }
  sampling_options o;
  o.seed = 4;
  auto a = sample_captions(*gpt, layout, captions, 2, o);
  auto b = sample_captions(*gpt, layout, captions, 2, o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == *b);
  CHECK_FALSE(sample_captions(*gpt, layout, {}, 2, o).ok());
  CHECK_FALSE(sample_captions(*gpt, layout, {"a bag", "a zebra"}, 2, o).ok());
}

} // namespace starling::test::kernels_t2i_sampler_test
