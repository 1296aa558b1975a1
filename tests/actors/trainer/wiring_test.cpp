#include "actors/trainer/wiring.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

namespace starling::test::actors_wiring_test {

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

TEST_CASE("the in-flight window follows the live peers, shared by the trainers and capped") {
  // 1000 peers, 6 per peer, 16 trainers: 375 each.
  CHECK(inflight_target(1000, 16, 6.0, 1024, 64) == 375);
  // Rounded up, never below one.
  CHECK(inflight_target(10, 3, 1.0, 1024, 64) == 4);
  CHECK(inflight_target(1, 100, 0.5, 1024, 64) == 1);
  // The cap bounds it.
  CHECK(inflight_target(1000, 1, 8.0, 512, 64) == 512);
  // Fewer peers (preempted ones gone): a smaller window.
  CHECK(inflight_target(800, 16, 6.0, 1024, 64) == 300);
  // Off, no peer seen yet or no trainers: the fixed window.
  CHECK(inflight_target(1000, 16, 0.0, 1024, 64) == 64);
  CHECK(inflight_target(0, 16, 6.0, 1024, 64) == 64);
  CHECK(inflight_target(1000, 0, 6.0, 1024, 64) == 64);
}

TEST_CASE("peek names the peer pick would choose without charging it, charge moves it down") {
  wiring_policy w(1);
  w.refresh(0, {"a", "b", "c"});
  for (auto id : {"a", "b", "c"})
    w.report_success(0, id, pass::forward, 1.0, 1.0);
  auto first = w.peek(0, 0.0);
  REQUIRE(first);
  CHECK(w.peek(0, 0.0) == first); // peeking again: same answer, nothing charged
  w.charge(0, *first, pass::forward, 1.0);
  auto second = w.peek(0, 0.0);
  REQUIRE(second);
  CHECK(*second != *first);
  // A refund takes the charge back (not below the minimum): the first is due again.
  w.refund(0, *first, pass::forward, 1.0);
  w.charge(0, *second, pass::forward, 1.0);
  CHECK(w.peek(0, 0.0) != second);
  // pick = peek + charge.
  auto due = w.peek(0, 0.0);
  CHECK(w.pick(0, pass::forward, 1.0, 0.0) == due);
  CHECK(w.peek(0, 0.0) != due);
}

TEST_CASE("sample gives distinct candidates: the due peer first, others by throughput") {
  wiring_options o;
  o.seed = 11;
  wiring_policy w(1, o);
  w.refresh(0, {"due", "slow", "fast"});
  w.report_success(0, "due", pass::forward, 1.0, 1.0);
  w.report_success(0, "slow", pass::forward, 1.0, 1.0);  // 1 sample/s
  w.report_success(0, "fast", pass::forward, 9.0, 1.0);  // 9 samples/s
  // Make "due" the least loaded.
  w.charge(0, "slow", pass::forward, 1.0);
  w.charge(0, "fast", pass::forward, 9.0);
  std::map<std::string, int> second;
  for (int i = 0; i < 1000; ++i) {
    auto c = w.sample(0, 0.0, 2);
    REQUIRE(c.size() == 2);
    CHECK(c[0] == "due");
    CHECK(c[1] != c[0]);
    ++second[c[1]];
  }
  // Nothing was charged: still the same first candidate; "fast" drawn ~9x as often as "slow".
  CHECK(w.peek(0, 0.0) == std::optional<std::string>{"due"});
  CHECK(second["fast"] > 800);
  CHECK(second["slow"] > 50);
  // Fewer ready peers than asked: as many as there are; excluded peers are not candidates.
  w.exclude(0, "fast", 10.0);
  auto c = w.sample(0, 0.0, 5);
  CHECK(c.size() == 2);
  CHECK(std::find(c.begin(), c.end(), "fast") == c.end());
  wiring_policy empty(1);
  CHECK(empty.sample(0, 0.0, 2).empty());
}

} // namespace starling::test::actors_wiring_test
