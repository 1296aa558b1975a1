#include "actors/trainer/wiring.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>

using namespace starling::actors::trainer;

TEST_CASE("the bias-corrected average equals the first sample and tracks later ones") {
  throughput_ema e(0.1);
  CHECK_FALSE(e.measured());
  CHECK(e.value() == 0.0);
  e.add(10.0);
  CHECK(e.value() == doctest::Approx(10.0));
  e.add(20.0);
  // (0.9*0.1*10 + 0.1*20) / (1 - 0.81)
  CHECK(e.value() == doctest::Approx((0.09 * 10 + 0.1 * 20) / 0.19));
  for (int i = 0; i < 200; ++i)
    e.add(30.0);
  CHECK(e.value() == doctest::Approx(30.0).epsilon(1e-6));
}

TEST_CASE("picks converge to throughput proportions for speeds 1:2:4") {
  wiring_policy w(1);
  w.refresh(0, {"slow", "mid", "fast"});
  std::map<std::string, double> speed{{"slow", 1.0}, {"mid", 2.0}, {"fast", 4.0}};
  std::mt19937_64 gen(7);
  std::normal_distribution<double> noise(1.0, 0.05); // measured throughput jitters by ~5%
  std::map<std::string, int> picks;
  const int total = 7000;
  double now = 0.0;
  for (int i = 0; i < total; ++i) {
    auto p = w.pick(0, pass::forward, 4.0, now);
    REQUIRE(p);
    ++picks[*p];
    w.report_success(0, *p, pass::forward, 4.0, 4.0 / (speed[*p] * noise(gen)));
    now += 0.01;
  }
  for (auto& [id, s] : speed) {
    CAPTURE(id);
    auto share = static_cast<double>(picks[id]) / total;
    CHECK(std::abs(share - s / 7.0) <= 0.05 * s / 7.0);
  }
  CHECK(*w.throughput(0, "fast", pass::forward) == doctest::Approx(4.0).epsilon(0.1));
}

TEST_CASE("backward work is charged 2.5x forward until measured") {
  wiring_policy w(1);
  w.add_peer(0, "a");
  w.report_success(0, "a", pass::forward, 10.0, 1.0); // 10 samples/s forward
  CHECK(*w.throughput(0, "a", pass::backward) == doctest::Approx(4.0));
  w.report_success(0, "a", pass::backward, 10.0, 2.0);
  CHECK(*w.throughput(0, "a", pass::backward) == doctest::Approx(5.0));
}

TEST_CASE("a new peer enters at the heap minimum and is picked within a few calls") {
  wiring_policy w(2);
  w.refresh(1, {"a", "b", "c"});
  for (int i = 0; i < 300; ++i) {
    auto p = w.pick(1, pass::forward, 1.0, 0.0);
    w.report_success(1, *p, pass::forward, 1.0, 1.0);
  }
  w.refresh(1, {"a", "b", "c", "newcomer"});
  int calls = 0;
  while (calls < 10 && w.pick(1, pass::forward, 1.0, 0.0) != "newcomer")
    ++calls;
  // At the minimum it ties with the least loaded peers: it comes up within one round over them.
  CHECK(calls <= 3);
  // Entering at the minimum, not at zero: it does not take every request for a long while.
  std::map<std::string, int> next;
  for (int i = 0; i < 40; ++i)
    ++next[*w.pick(1, pass::forward, 1.0, 0.0)];
  CHECK(next["newcomer"] <= 12);
  CHECK(next["a"] >= 8);
}

TEST_CASE("an excluded peer is never picked until its expiry") {
  wiring_policy w(1);
  w.refresh(0, {"a", "b"});
  w.exclude(0, "a", 10.0);
  CHECK(w.excluded(0, "a", 9.99));
  for (double now = 0.0; now < 10.0; now += 0.05) {
    CAPTURE(now);
    CHECK(w.pick(0, pass::forward, 1.0, now) == "b");
  }
  CHECK_FALSE(w.excluded(0, "a", 10.0));
  // After expiry it is back, at the minimum: picked next, and then in turn with b.
  CHECK(w.pick(0, pass::forward, 1.0, 10.0) == "a");
  std::map<std::string, int> n;
  for (int i = 0; i < 20; ++i)
    ++n[*w.pick(0, pass::forward, 1.0, 10.0)];
  CHECK(n["a"] == 10);
  CHECK(n["b"] == 10);
}

TEST_CASE("a stage whose peers are all excluded or gone has no pick") {
  wiring_policy w(1);
  CHECK_FALSE(w.pick(0, pass::forward, 1.0, 0.0));
  w.refresh(0, {"a"});
  w.exclude(0, "a", 5.0);
  CHECK_FALSE(w.pick(0, pass::backward, 1.0, 1.0));
  CHECK(w.pick(0, pass::backward, 1.0, 5.0) == "a");
  w.refresh(0, {});
  CHECK(w.peers(0).empty());
  CHECK_FALSE(w.pick(0, pass::forward, 1.0, 6.0));
}

TEST_CASE("refresh keeps known peers' measurements and exclusions") {
  wiring_policy w(1);
  w.refresh(0, {"a", "b"});
  w.report_success(0, "a", pass::forward, 8.0, 1.0);
  w.exclude(0, "b", 3.0);
  w.refresh(0, {"b", "a", "c"});
  CHECK(*w.throughput(0, "a", pass::forward) == doctest::Approx(8.0));
  CHECK(w.excluded(0, "b", 2.0));
  CHECK((w.peers(0) == std::vector<std::string>{"a", "b", "c"}));
  w.refresh(0, {"c"});
  CHECK_FALSE(w.throughput(0, "a", pass::forward));
}
