#include "actors/btard/attacks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <torch/torch.h>

namespace starling::test::btard_attacks {

namespace btard = starling::actors::btard;

TEST_CASE("attack names round-trip and an unknown one lists the known names") {
  for (auto k : {btard::attack_kind::none, btard::attack_kind::sign_flip,
                 btard::attack_kind::random_direction, btard::attack_kind::label_flip,
                 btard::attack_kind::delayed, btard::attack_kind::ipm, btard::attack_kind::alie}) {
    auto back = btard::parse_attack(btard::attack_name(k));
    REQUIRE(back);
    CHECK(*back == k);
  }
  auto bad = btard::parse_attack("signflip");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().what.find("sign_flip") != std::string::npos);
}

TEST_CASE("the schedule: from the start step, every k-th step; delayed replays a window") {
  btard::attack_options o;
  o.kind = btard::attack_kind::sign_flip;
  o.start_step = 10;
  o.every = 3;
  CHECK_FALSE(btard::attacks_at(o, 9));
  CHECK(btard::attacks_at(o, 10));
  CHECK_FALSE(btard::attacks_at(o, 11));
  CHECK(btard::attacks_at(o, 13));
  o.kind = btard::attack_kind::none;
  CHECK_FALSE(btard::attacks_at(o, 10));
  o.kind = btard::attack_kind::delayed;
  o.delay = 5;
  o.duration = 4;
  CHECK(btard::attacks_at(o, 11));
  CHECK(btard::attacks_at(o, 13));
  CHECK_FALSE(btard::attacks_at(o, 14));
  CHECK(btard::validate(o));
  o.duration = 6;
  CHECK_FALSE(btard::validate(o));
  o.duration = 4;
  o.every = 0;
  CHECK_FALSE(btard::validate(o));
  o.every = 1;
  o.scale = -1;
  CHECK_FALSE(btard::validate(o));
}

TEST_CASE("sign flip and label flip") {
  auto g = torch::tensor({1.0f, -2.0f, 0.5f});
  CHECK(torch::equal(btard::sign_flip(g, 1000), torch::tensor({-1000.0f, 2000.0f, -500.0f})));
  auto y = torch::tensor({0, 3, 9}, torch::kLong);
  auto f = btard::flip_labels(y, 10);
  REQUIRE(f);
  CHECK(torch::equal(*f, torch::tensor({9, 6, 0}, torch::kLong)));
  CHECK_FALSE(btard::flip_labels(torch::tensor({10}, torch::kLong), 10));
  CHECK_FALSE(btard::flip_labels(torch::tensor({-1}, torch::kLong), 10));
  CHECK_FALSE(btard::flip_labels(torch::tensor({1.0f}), 10));
}

TEST_CASE("the random direction is shared by every attacker, unit per tensor, scaled per norm") {
  std::vector<std::vector<int64_t>> shapes{{4, 3}, {5}};
  btard::random_direction_attack a{42, shapes}, b{42, shapes}, other{43, shapes};
  REQUIRE(a.directions().size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(torch::equal(a.directions()[i], b.directions()[i]));
    CHECK_FALSE(torch::equal(a.directions()[i], other.directions()[i]));
    CHECK(a.directions()[i].norm().item<double>() == doctest::Approx(1.0).epsilon(1e-6));
  }
  torch::manual_seed(1);
  std::vector<at::Tensor> grads{torch::randn({4, 3}), torch::randn({5})};
  auto out = a.apply(grads, 1000);
  REQUIRE(out);
  for (size_t i = 0; i < 2; ++i) {
    CHECK((*out)[i].norm().item<double>()
          == doctest::Approx(1000 * grads[i].norm().item<double>()).epsilon(1e-5));
    // The same direction whatever the gradient: cosine 1 with the stored direction.
    auto cos = ((*out)[i] * a.directions()[i]).sum().item<double>() / (*out)[i].norm().item<double>();
    CHECK(cos == doctest::Approx(1.0).epsilon(1e-5));
  }
  CHECK_FALSE(a.apply({grads[0]}, 1000));
  CHECK_FALSE(a.apply({grads[1], grads[0]}, 1000));
}

TEST_CASE("delayed gradients keep only the replay window and replay step t - D at step t") {
  btard::attack_options o;
  o.kind = btard::attack_kind::delayed;
  o.start_step = 10;
  o.delay = 6;
  o.duration = 3;
  btard::delayed_gradients d{o};
  for (uint64_t t = 0; t < 14; ++t) {
    if (t >= 10) {
      auto r = d.replay(t);
      if (t < 13) {
        REQUIRE(r);
        CHECK(r->item<float>() == static_cast<float>(t - 6));
      } else {
        CHECK_FALSE(r);
      }
    } else {
      CHECK_FALSE(d.replay(t));
    }
    d.record(t, torch::tensor({static_cast<float>(t)}));
  }
  CHECK(d.kept() == 3);
  // A peer that joined after the window started replays only what it saw.
  btard::delayed_gradients late{o};
  late.record(5, torch::tensor({5.0f}));
  CHECK_FALSE(late.replay(10));
  CHECK(late.replay(11));
}

TEST_CASE("IPM and ALIE from the honest gradients' statistics") {
  std::vector<at::Tensor> honest{torch::tensor({1.0f, 0.0f}), torch::tensor({3.0f, 0.0f}),
                                 torch::tensor({2.0f, 3.0f})};
  auto h = btard::statistics_of(honest);
  REQUIRE(h);
  CHECK(h->count == 3);
  CHECK(torch::allclose(h->mean, torch::tensor({2.0f, 1.0f})));
  // Sample standard deviation: sqrt(((1-2)^2 + (3-2)^2 + 0) / 2) = 1; sqrt((1 + 1 + 4) / 2).
  CHECK(torch::allclose(h->std, torch::tensor({1.0f, static_cast<float>(std::sqrt(3.0))})));
  CHECK(torch::allclose(btard::ipm(*h, 0.5), torch::tensor({-1.0f, -0.5f})));
  CHECK(torch::allclose(btard::alie(*h, 2.0),
                        torch::tensor({0.0f, static_cast<float>(1 - 2 * std::sqrt(3.0))})));
  CHECK_FALSE(btard::statistics_of({}));
  CHECK_FALSE(btard::statistics_of({torch::zeros({2}), torch::zeros({3})}));
  auto one = btard::statistics_of({torch::tensor({4.0f})});
  REQUIRE(one);
  CHECK(one->std.item<float>() == 0.0f);
}

TEST_CASE("ALIE's z: n = 16, b = 7 gives s = 2 and z = Φ⁻¹(14/16)") {
  auto z = btard::alie_z(16, 7);
  REQUIRE(z);
  CHECK(*z == doctest::Approx(1.1503493803760079).epsilon(1e-12));
  // s = floor(n/2 + 1) - b must lie in [1, n - 1].
  CHECK_FALSE(btard::alie_z(16, 9));
  CHECK(btard::alie_z(16, 8));
  CHECK_FALSE(btard::alie_z(1, 0));
}

TEST_CASE("the normal quantile inverts the normal CDF to double precision") {
  CHECK(btard::normal_quantile(0.5) == doctest::Approx(0.0).epsilon(1e-15));
  CHECK(btard::normal_quantile(0.975) == doctest::Approx(1.959963984540054).epsilon(1e-13));
  CHECK(btard::normal_quantile(0.025) == doctest::Approx(-1.959963984540054).epsilon(1e-13));
  for (double p : {1e-300, 1e-20, 1e-5, 0.02425, 0.1, 0.3, 0.7, 0.97575, 0.99999, 1 - 1e-12}) {
    auto x = btard::normal_quantile(p);
    auto back = 0.5 * std::erfc(-x / std::sqrt(2.0));
    CHECK(back == doctest::Approx(p).epsilon(1e-12));
  }
  CHECK(std::isnan(btard::normal_quantile(0)));
  CHECK(std::isnan(btard::normal_quantile(1)));
  CHECK(std::isnan(btard::normal_quantile(std::nan(""))));
}

} // namespace starling::test::btard_attacks
