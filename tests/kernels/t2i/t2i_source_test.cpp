// The demo's data source: captioned Fashion-MNIST images as [caption | separator | image tokens]
// sequences from a codebook fit by every process, and the digest check a pinned codebook gets.
#include "kernels/t2i/t2i_source.hpp"

#include <doctest/doctest.h>

#include <torch/torch.h>

#include <string>

namespace starling::test::kernels_t2i_source_test {

using namespace starling::kernels;

namespace {

/// A small split: 200 training images, 50 test images, 32 codes fit in a few iterations (the
/// synthetic stand-in when Fashion-MNIST is absent).
t2i_data_options small_options() {
  t2i_data_options o;
  o.images.max_items = 200;
  o.images.synthetic_when_absent = true;
  o.codebook.codes = 32;
  o.codebook.max_images = 200;
  o.codebook.max_iterations = 5;
  o.codebook.seed = 7;
  o.caption_seed = 7;
  o.eval_images = 50;
  return o;
}

} // namespace

TEST_CASE("captioned images become shifted sequences whose image part is the codebook's tokens") {
  auto split = make_t2i_split(small_options());
  REQUIRE_MESSAGE(split.ok(), (split.ok() ? "" : split.error().what));
  auto& train = *split->train;
  CHECK(train.size() == 200);
  CHECK(split->eval->size() == 50);
  auto& layout = train.layout();
  CHECK(layout.codes == 32);
  CHECK(layout.image_tokens == 49);
  auto shape = train.shape();
  REQUIRE(shape.input.size() == 1);
  CHECK(shape.input[0] == layout.sequence_length() - 1);
  CHECK(shape.classes == layout.vocab());
  auto b = train.batch({3, 0, 199});
  REQUIRE(b.ok());
  CHECK(b->inputs.sizes() == torch::IntArrayRef{3, layout.sequence_length() - 1});
  CHECK(b->targets.sizes() == b->inputs.sizes());
  // Targets are the inputs shifted by one token.
  CHECK(torch::equal(b->inputs.slice(1, 1), b->targets.slice(1, 0, -1)));
  // The prompt ends with the separator; every image token is a code, and equals the tokenizer's.
  auto p = layout.prompt_length();
  CHECK(b->inputs[0][p - 1].item<int64_t>() == layout.separator());
  auto image = b->targets.slice(1, p - 1);
  CHECK(image.min().item<int64_t>() >= 0);
  CHECK(image.max().item<int64_t>() < layout.codes);
  auto& imgs = train.images();
  std::vector<float> px(imgs.pixels.begin() + 3 * 784, imgs.pixels.begin() + 4 * 784);
  auto tokens = tokenize_images(train.codebook(), px, 1, 28, 28);
  REQUIRE(tokens.ok());
  auto row = image[0].contiguous();
  CHECK(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + 49) == *tokens);
  // The caption is the sample's class in its seeded phrasing.
  auto caption = caption_for(imgs.labels[3], phrasing_for(7, 3));
  REQUIRE(caption.ok());
  auto words = caption_to_tokens(layout, *caption);
  REQUIRE(words.ok());
  for (std::size_t i = 0; i < words->size(); ++i)
    CHECK(b->inputs[0][static_cast<int64_t>(i)].item<int64_t>() == (*words)[i]);
  CHECK_FALSE(train.batch({200}).ok());
}

TEST_CASE("the same images and seed give the same codebook; a pinned digest is checked") {
  auto a = make_t2i_split(small_options());
  auto b = make_t2i_split(small_options());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->digest == b->digest);
  CHECK(a->digest == codebook_digest(a->train->codebook()));
  auto pinned = small_options();
  pinned.codebook_digest = a->digest;
  CHECK(make_t2i_split(pinned).ok());
  auto other = small_options();
  other.codebook.seed = 8;
  auto c = make_t2i_split(other);
  REQUIRE(c.ok());
  CHECK(c->digest != a->digest);
  other.codebook_digest = a->digest;
  auto refused = make_t2i_split(other);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.error().what.find("pins " + a->digest) != std::string::npos,
                refused.error().what);
  auto bad = small_options();
  bad.codebook_digest = "abc";
  CHECK_FALSE(make_t2i_split(bad).ok());
  bad = small_options();
  bad.codebook.patch = 5;
  CHECK_FALSE(validate(bad).ok());
  bad = small_options();
  bad.codebook.codes = 1;
  CHECK_FALSE(validate(bad).ok());
}

} // namespace starling::test::kernels_t2i_source_test
