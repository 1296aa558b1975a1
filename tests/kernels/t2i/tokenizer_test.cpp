#include "kernels/t2i/tokenizer.hpp"

#include <doctest/doctest.h>

#include "demo_images.hpp"

namespace starling::test::kernels_t2i_tokenizer_test {

using namespace starling::kernels;

namespace {

codebook_options small_options(uint64_t seed) {
  codebook_options o;
  o.codes = 32;
  o.max_images = 300;
  o.seeding_pool = 4000;
  o.max_iterations = 10;
  o.seed = seed;
  return o;
}

double mean_squared(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += (a[i] - b[i]) * (a[i] - b[i]);
  return s / static_cast<double>(a.size());
}

} // namespace

TEST_CASE("the codebook is a function of the images and the seed") {
  auto images = demo_images(300, true);
  auto a = fit_codebook(images, small_options(1));
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().what));
  auto b = fit_codebook(images, small_options(1));
  REQUIRE(b.ok());
  auto c = fit_codebook(images, small_options(2));
  REQUIRE(c.ok());
  CHECK(a->codebook.size() == 32);
  CHECK(a->codebook.patch == 4);
  CHECK(a->patches == 300 * 49);
  CHECK(validate(a->codebook).ok());
  CHECK(codebook_digest(a->codebook) == codebook_digest(b->codebook));
  CHECK(codebook_digest(a->codebook) != codebook_digest(c->codebook));
  // More Lloyd iterations improve on one.
  auto once = small_options(1);
  once.max_iterations = 1;
  auto seeded = fit_codebook(images, once);
  REQUIRE(seeded.ok());
  CHECK(a->iterations > 1);
  CHECK(a->mse < seeded->mse);
}

TEST_CASE("tokens reconstruct the image to the codebook's error, and a code maps to itself") {
  auto images = demo_images(300, true);
  auto fit = fit_codebook(images, small_options(1));
  REQUIRE(fit.ok());
  auto& cb = fit->codebook;
  CHECK(tokens_per_image(cb, 28, 28) == 49);
  auto tokens = tokenize_images(cb, images.pixels, images.count, 28, 28);
  REQUIRE(tokens.ok());
  REQUIRE(tokens->size() == 300 * 49);
  for (auto t : *tokens)
    CHECK((t >= 0 && t < 32));
  auto back = detokenize_images(cb, *tokens, 28, 28);
  REQUIRE(back.ok());
  REQUIRE(back->size() == images.pixels.size());
  CHECK(mean_squared(*back, images.pixels) == doctest::Approx(fit->mse).epsilon(1e-3));
  // The reconstruction is made of codes: tokenizing it gives its tokens back.
  auto again = tokenize_images(cb, *back, images.count, 28, 28);
  REQUIRE(again.ok());
  std::size_t same = 0;
  for (std::size_t i = 0; i < tokens->size(); ++i)
    same += (*again)[i] == (*tokens)[i];
  CHECK(same == tokens->size());
  // Patch order: token t of an image covers rows 4·(t / 7).., columns 4·(t % 7)...
  std::vector<int64_t> one(49, 0);
  one[8] = 5; // grid row 1, column 1
  auto img = detokenize_images(cb, one, 28, 28);
  REQUIRE(img.ok());
  CHECK((*img)[5 * 28 + 6] == cb.codes[5 * 16 + 1 * 4 + 2]);
  CHECK((*img)[0] == cb.codes[0]);
}

TEST_CASE("empty clusters are re-seeded and bad inputs are refused") {
  // Three distinct patch values only, eight codes: k-means++ runs out of distinct seeds.
  image_set flat;
  flat.count = 3;
  flat.rows = flat.cols = 8;
  flat.pixels.assign(3 * 64, 0.0f);
  for (std::size_t i = 0; i < 64; ++i)
    flat.pixels[64 + i] = 1.0f;
  for (std::size_t i = 0; i < 16; ++i)
    flat.pixels[128 + i] = 0.5f;
  flat.labels = {0, 1, 2};
  codebook_options o;
  o.codes = 8;
  o.seed = 4;
  auto fit = fit_codebook(flat, o);
  REQUIRE_MESSAGE(fit.ok(), (fit.ok() ? "" : fit.error().what));
  CHECK(fit->reseeded > 0);
  CHECK(fit->mse == doctest::Approx(0.0));
  CHECK(validate(fit->codebook).ok());
  auto again = fit_codebook(flat, o);
  REQUIRE(again.ok());
  CHECK(again->codebook.codes == fit->codebook.codes);

  o.codes = 13; // 12 patches
  CHECK_FALSE(fit_codebook(flat, o).ok());
  o.codes = 4;
  o.patch = 3; // does not divide 8
  CHECK_FALSE(fit_codebook(flat, o).ok());
  o.patch = 4;
  auto& cb = fit->codebook;
  CHECK_FALSE(tokenize_images(cb, flat.pixels, 2, 8, 8).ok());
  CHECK_FALSE(detokenize_images(cb, {0, 1, 2}, 8, 8).ok());
  CHECK_FALSE(detokenize_images(cb, {0, 1, 2, 8}, 8, 8).ok());
  CHECK_FALSE(detokenize_images(cb, {0, 1, 2, -1}, 8, 8).ok());
}

} // namespace starling::test::kernels_t2i_tokenizer_test
