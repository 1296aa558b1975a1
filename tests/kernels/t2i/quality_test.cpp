#include "kernels/t2i/quality.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "demo_images.hpp"

namespace starling::test::kernels_t2i_quality_test {

using namespace starling::kernels;

TEST_CASE("the classifier learns Fashion-MNIST well above chance, the same for a seed") {
  auto train = demo_images(3000, true);
  auto test = demo_images(500, false);
  classifier_options o;
  o.hidden = 64;
  o.epochs = 2;
  o.seed = 5;
  auto a = image_classifier::train(train, o);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().what));
  auto acc = a->accuracy(test.pixels, test.labels);
  REQUIRE(acc.ok());
  MESSAGE("classifier accuracy on 500 test images: " << *acc);
  CHECK(*acc > 0.6);
  auto b = image_classifier::train(train, o);
  REQUIRE(b.ok());
  CHECK(*b->predict(test.pixels, test.count) == *a->predict(test.pixels, test.count));
  CHECK_FALSE(a->accuracy({0.5f}, {1}).ok());
  CHECK_FALSE(a->accuracy({}, {}).ok());
  o.epochs = 0;
  CHECK_FALSE(image_classifier::train(train, o).ok());
}

TEST_CASE("quality.json holds the three accuracies and the per-caption ones") {
  quality_report r;
  r.real = 0.85;
  r.reconstruction = 0.8;
  r.test_images = 1000;
  r.codebook_digest = "ab";
  r.generated = {{"a bag", 8, 8, 0.5}, {"a coat", 4, 8, 0.25}};
  auto j = nlohmann::json::parse(quality_json(r));
  CHECK(j["classifier_accuracy"]["real"] == 0.85);
  CHECK(j["classifier_accuracy"]["reconstruction"] == 0.8);
  CHECK(j["classifier_accuracy"]["generated"] == doctest::Approx(0.375));
  CHECK(j["test_images"] == 1000);
  CHECK(j["per_caption"].size() == 2);
  CHECK(j["per_caption"][1]["caption"] == "a coat");
  CHECK(j["per_caption"][1]["label"] == 4);
}

} // namespace starling::test::kernels_t2i_quality_test
