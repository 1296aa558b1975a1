// The loss-burst rule (runtime/metrics/loss_bursts.hpp): flags what jumps above the recent
// median by more than the margin, groups consecutive flags, ignores ordinary noise and a falling
// curve, and is not fooled by a long burst raising its own reference.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "runtime/metrics/loss_bursts.hpp"

namespace starling::test::runtime_metrics_loss_bursts_test {

using starling::runtime::burst_detector;

TEST_CASE("a falling, noisy loss curve has no burst") {
  burst_detector d;
  std::mt19937_64 rng{7};
  std::normal_distribution<double> noise{0.0, 0.05};
  for (int i = 0; i < 600; ++i)
    CHECK_FALSE(d.add(i * 0.1, 5.6 * std::exp(-i / 300.0) + 2.0 + noise(rng)));
  CHECK(d.flagged() == 0);
  CHECK(d.bursts().empty());
  CHECK(d.largest_excess() < 0.5);
}

TEST_CASE("six bad microbatches between good ones are one burst, named with its times") {
  burst_detector d;
  for (int i = 0; i < 40; ++i)
    d.add(i * 0.1, 4.0 + 0.01 * (i % 3));
  for (int i = 0; i < 6; ++i)
    CHECK(d.add(4.0 + i * 0.1, 7.0 + 0.05 * i));
  CHECK_FALSE(d.add(4.6, 3.9));
  // A second, single-batch burst later.
  for (int i = 0; i < 10; ++i)
    d.add(5.0 + i * 0.1, 3.9);
  CHECK(d.add(6.0, 4.6));
  REQUIRE(d.bursts().size() == 2);
  auto& b = d.bursts()[0];
  CHECK(b.batches == 6);
  CHECK(b.start_t == doctest::Approx(4.0));
  CHECK(b.end_t == doctest::Approx(4.5));
  CHECK(b.peak_loss == doctest::Approx(7.25));
  CHECK(b.reference == doctest::Approx(4.01));
  CHECK(b.peak_excess == doctest::Approx(7.25 - 4.01));
  CHECK(d.bursts()[1].batches == 1);
  CHECK(d.flagged() == 7);
}

TEST_CASE("a burst longer than the window keeps the reference it started from") {
  burst_detector::options o;
  o.window = 8;
  o.min_history = 4;
  burst_detector d{o};
  for (int i = 0; i < 8; ++i)
    d.add(i, 3.0);
  for (int i = 0; i < 40; ++i)
    CHECK(d.add(10 + i, 6.0));
  REQUIRE(d.bursts().size() == 1);
  CHECK(d.bursts()[0].batches == 40);
}

TEST_CASE("the margin is a bound: just below it passes, just above it is flagged; NaN is flagged") {
  burst_detector d;
  for (int i = 0; i < 20; ++i)
    d.add(i, 2.0);
  CHECK_FALSE(d.add(20, 2.49));
  CHECK(d.add(21, 2.51));
  CHECK(d.add(22, std::numeric_limits<double>::quiet_NaN()));
  CHECK(d.bursts().size() == 1);
  CHECK(d.flagged() == 2);
  // Nothing is flagged before `min_history` losses are known.
  burst_detector fresh;
  for (int i = 0; i < 7; ++i)
    CHECK_FALSE(fresh.add(i, i % 2 ? 9.0 : 1.0));
}

} // namespace starling::test::runtime_metrics_loss_bursts_test
