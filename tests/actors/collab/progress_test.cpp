#include "actors/collab/progress.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

namespace starling::test::actors_progress_test {

using namespace starling::actors::collab;

namespace {

progress_options opts(uint64_t target = 100) {
  progress_options o;
  o.target_batch = target;
  return o;
}

held_record rec(const std::string& peer, uint64_t step, uint64_t samples, double rate, seconds t,
                seconds expires = 1e9) {
  progress_record r;
  r.peer = peer;
  r.step = step;
  r.samples = samples;
  r.rate = rate;
  r.time = t;
  return {r, expires};
}

progress_entry entry(const progress_record& r, seconds expires, std::string subkey = {}) {
  return {subkey.empty() ? r.peer : subkey, encode_progress(r), expires};
}

} // namespace

TEST_CASE("a fast peer makes the step come sooner") {
  auto o = opts(100);
  // Alone at 10 samples/s: 100 samples take 10 s.
  auto alone = estimate_progress({}, "me", 0, 0, 10, 0, o);
  CHECK(alone.eta == 10.0);
  CHECK(alone.peers == 1);
  // With a peer as fast as us: 5 s.
  auto slow = estimate_progress({rec("b", 0, 0, 10, 0)}, "me", 0, 0, 10, 0, o);
  CHECK(slow.eta == 5.0);
  // With a peer three times as fast: 2.5 s.
  auto fast = estimate_progress({rec("b", 0, 0, 30, 0)}, "me", 0, 0, 10, 0, o);
  CHECK(fast.eta == 2.5);
  CHECK(fast.eta_at == 2.5);
  CHECK(fast.peers == 2);
  CHECK(fast.rate == 40.0);
  CHECK_FALSE(fast.reached);
}

TEST_CASE("the estimate extrapolates each record from its own time") {
  auto o = opts(100);
  // b published 20 samples at t = 1 at 10/s; c 5 samples at t = 3 at 5/s; we have 10 at 2/s.
  std::vector<held_record> others{rec("b", 4, 20, 10, 1), rec("c", 4, 5, 5, 3)};
  auto e = estimate_progress(others, "me", 4, 10, 2, 5, o);
  // 10 + (20 + 10·4) + (5 + 5·2) = 85; 15 left at 17/s.
  CHECK(e.samples == 85.0);
  CHECK(e.rate == 17.0);
  CHECK(e.eta == doctest::Approx(15.0 / 17.0));
  // At the ETA the others' extrapolated samples plus our real count (10 + 2/s · 0.88 s, i.e.
  // 12 by then) reach the target: the step is due. Our own count is never extrapolated.
  auto at = 5 + 15.0 / 17.0 + 1e-9;
  auto later = estimate_progress(others, "me", 4, 12, 2, at, o);
  CHECK(later.reached);
  CHECK(later.eta == 0.0);
  CHECK_FALSE(estimate_progress(others, "me", 4, 10, 2, at, o).reached);
}

TEST_CASE("records at other steps do not count, peers ahead are reported, highest first") {
  auto o = opts(100);
  std::vector<held_record> others{rec("old", 2, 50, 10, 0), rec("a1", 4, 1, 1, 0),
                                  rec("a2", 5, 1, 1, 0), rec("same", 3, 7, 0, 0)};
  auto e = estimate_progress(others, "me", 3, 0, 0, 0, o);
  CHECK(e.samples == 7.0);
  CHECK(e.behind == 1);
  REQUIRE(e.ahead.size() == 2);
  CHECK(e.ahead[0].peer == "a2");
  CHECK(e.ahead[0].step == 5);
  CHECK(e.ahead[1].peer == "a1");
}

TEST_CASE("the peer's own record is ignored: its own count is exact") {
  auto o = opts(100);
  auto e = estimate_progress({rec("me", 0, 90, 100, 0)}, "me", 0, 3, 1, 10, o);
  CHECK(e.samples == 3.0);
  CHECK(e.peers == 1);
}

TEST_CASE("a departed peer's rate stops counting once its record expires") {
  auto o = opts(1000);
  std::vector<held_record> others{rec("gone", 0, 0, 40, 0, /*expires*/ 10)};
  auto before = estimate_progress(others, "me", 0, 0, 10, 9.5, o);
  CHECK(before.rate == 50.0);
  CHECK(before.samples == 380.0);
  auto at = estimate_progress(others, "me", 0, 0, 10, 10, o);
  CHECK(at.rate == 10.0);
  CHECK(at.samples == 0.0);
  CHECK(at.peers == 1);
  CHECK(at.eta == 100.0);
}

TEST_CASE("a departed peer's rate stops counting at once when its record is withdrawn") {
  auto o = opts(1000);
  progress_tracker t("me", o);
  progress_record b{"b", 0, 100, 40, 0, false, false};
  t.observe({entry(b, 60)}, 1);
  CHECK(t.estimate(0, 0, 10, 1).rate == 50.0);
  // b leaves on purpose: its tombstone replaces its record long before the record would expire.
  progress_record tomb = b;
  tomb.withdrawn = true;
  tomb.time = 2;
  auto s = t.observe({entry(tomb, 62)}, 2);
  CHECK(s.withdrawn == 1);
  auto e = t.estimate(0, 0, 10, 2);
  CHECK(e.rate == 10.0);
  CHECK(e.samples == 0.0);
  // A tombstone merged into a read that still holds the live record wins as well.
  t.observe({entry(b, 60), entry(tomb, 62)}, 2);
  CHECK(t.records().empty());
  // And the owner can drop a peer it learned left.
  t.observe({entry(b, 60)}, 3);
  CHECK(t.records().size() == 1);
  t.forget("b");
  CHECK(t.estimate(0, 0, 10, 3).rate == 10.0);
}

TEST_CASE("a read replaces the view: a peer missing from it no longer counts") {
  progress_tracker t("me", opts(1000));
  progress_record b{"b", 0, 10, 5, 0, false, false};
  progress_record c{"c", 0, 20, 5, 0, false, false};
  t.observe({entry(b, 60), entry(c, 60)}, 0);
  CHECK(t.estimate(0, 0, 0, 0).samples == 30.0);
  t.observe({entry(c, 60)}, 0);
  CHECK(t.estimate(0, 0, 0, 0).samples == 20.0);
  // Records already expired when read are dropped too.
  t.observe({entry(c, 5)}, 5);
  CHECK(t.records().empty());
}

TEST_CASE("the ETA is never negative") {
  auto o = opts(100);
  // Past the target.
  auto over = estimate_progress({rec("b", 0, 500, 10, 0)}, "me", 0, 50, 10, 3, o);
  CHECK(over.eta == 0.0);
  CHECK(over.reached);
  CHECK(over.eta_at == 3.0);
  // A record stamped in our future extrapolates nothing, not a negative amount.
  auto skew = estimate_progress({rec("b", 0, 10, 10, 100)}, "me", 0, 0, 0, 0, o);
  CHECK(skew.samples == 10.0);
  CHECK(skew.eta == 9.0);
  // Nobody makes progress: the ETA is infinite, not negative, and the refresh is the longest.
  auto stuck = estimate_progress({}, "me", 0, 5, 0, 0, o);
  CHECK(std::isinf(stuck.eta));
  CHECK(stuck.eta > 0);
  CHECK(stuck.refresh_in == o.max_refresh);
}

TEST_CASE("the refresh period follows ETA·N / max(N + 3, 1.2·N) and is clipped to (0.5, 30)") {
  progress_options o;
  // N = 1: max(4, 1.2) = 4.
  CHECK(refresh_period(10, 1, o) == 2.5);
  // N = 5: max(8, 6) = 8.
  CHECK(refresh_period(16, 5, o) == 10.0);
  // N = 20: max(23, 24) = 24: the drift rate takes over for large collaborations.
  CHECK(refresh_period(12, 20, o) == 10.0);
  // Clipped above and below.
  CHECK(refresh_period(1000, 20, o) == 30.0);
  CHECK(refresh_period(0.1, 1, o) == 0.5);
  CHECK(refresh_period(0, 10, o) == 0.5);
  CHECK(refresh_period(std::numeric_limits<double>::infinity(), 3, o) == 30.0);
  // The estimate uses it with its own peer count.
  auto e = estimate_progress({rec("b", 0, 0, 10, 0)}, "me", 0, 0, 10, 0, opts(200));
  CHECK(e.eta == 10.0);
  CHECK(e.refresh_in == 10.0 * 2 / 5);
}

TEST_CASE("peers whose rate is not measured yet bring the next read forward as if they went at "
          "the measured mean rate") {
  auto o = opts(4096);
  // 63 peers that just started (first records, rate 0); we measured 320/s and hold 64 samples.
  std::vector<held_record> others;
  for (int i = 0; i < 63; ++i)
    others.push_back(rec("p" + std::to_string(i), 0, 0, 0, 0));
  auto e = estimate_progress(others, "me", 0, 64, 320, 0.2, o);
  CHECK(e.peers == 64);
  CHECK(e.unmeasured == 63);
  // The ETA itself counts only measured rates: (4096 - 64) / 320.
  CHECK(e.eta == doctest::Approx(12.6));
  CHECK_FALSE(e.reached);
  // The refresh presumes 64 peers at 320/s: (4096 - 64) / 20480 = 0.197 s, clipped to 0.5 s
  // (counted at rate 0 it was 12.6 · 64 / 76.8 = 10.5 s).
  CHECK(e.refresh_in == o.min_refresh);
  // Half of them measured: the others are presumed at their mean.
  std::vector<held_record> half;
  for (int i = 0; i < 2; ++i)
    half.push_back(rec("p" + std::to_string(i), 0, 0, i == 0 ? 30 : 0, 0));
  auto h = estimate_progress(half, "me", 0, 0, 10, 0, opts(400));
  // Known 40/s over 2 measured peers: 60/s for 3; ETA' = 400 / 60; refresh = ETA'·3 / 6.
  CHECK(h.eta == doctest::Approx(10.0));
  CHECK(h.refresh_in == doctest::Approx(400.0 / 60 * 3 / 6));
  // Nobody measured: nothing to presume.
  auto none = estimate_progress(others, "me", 0, 0, 0, 0, o);
  CHECK(none.refresh_in == o.max_refresh);
}

TEST_CASE("progress options are validated") {
  CHECK(validate(progress_options{}).ok());
  auto o = progress_options{};
  o.target_batch = 0;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.min_refresh = 5;
  o.max_refresh = 1;
  CHECK_FALSE(validate(o).ok());
  o = {};
  o.record_lifetime = 0;
  CHECK_FALSE(validate(o).ok());
}

TEST_CASE("a progress record survives encode and decode") {
  progress_record r{"peer-7", 12, 345, 67.5, 1234.25, true, false};
  auto d = decode_progress(encode_progress(r));
  REQUIRE(d.ok());
  CHECK(d->peer == "peer-7");
  CHECK(d->step == 12);
  CHECK(d->samples == 345);
  CHECK(d->rate == 67.5);
  CHECK(d->time == 1234.25);
  CHECK(d->client_mode);
  CHECK_FALSE(d->withdrawn);
  r.withdrawn = true;
  r.client_mode = false;
  auto t = decode_progress(encode_progress(r));
  REQUIRE(t.ok());
  CHECK(t->withdrawn);
  CHECK_FALSE(t->client_mode);
  CHECK_FALSE(t->resync);
  r.withdrawn = false;
  r.resync = true;
  auto q = decode_progress(encode_progress(r));
  REQUIRE(q.ok());
  CHECK(q->resync);
  CHECK_FALSE(q->withdrawn);
}

TEST_CASE("decode rejects malformed progress records") {
  progress_record r{"p", 1, 2, 3, 4, false, false};
  auto good = encode_progress(r);
  REQUIRE(decode_progress(good).ok());
  auto broken = [&](auto mutate) {
    auto b = good;
    mutate(b);
    return decode_progress(b);
  };
  CHECK_FALSE(decode_progress({}).ok());
  CHECK_FALSE(broken([](std::vector<char>& b) { b.pop_back(); }).ok());
  CHECK_FALSE(broken([](std::vector<char>& b) { b.push_back('x'); }).ok());
  CHECK_FALSE(broken([](std::vector<char>& b) { b[0] = 2; }).ok());          // version
  CHECK_FALSE(broken([](std::vector<char>& b) { b[1] = 8; }).ok());          // unknown flag
  CHECK_FALSE(broken([](std::vector<char>& b) { b[34] = 0; }).ok());         // empty id
  CHECK_FALSE(broken([](std::vector<char>& b) { b[34] = char(200); }).ok()); // id too long
  CHECK_FALSE(broken([](std::vector<char>& b) { b[17] = 0x01; }).ok());      // samples > 2^53
  auto with_rate = [&](double v) {
    auto x = r;
    x.rate = v;
    return decode_progress(encode_progress(x));
  };
  CHECK_FALSE(with_rate(-1).ok());
  CHECK_FALSE(with_rate(std::nan("")).ok());
  CHECK_FALSE(with_rate(std::numeric_limits<double>::infinity()).ok());
  CHECK_FALSE(with_rate(1e13).ok());
  auto x = r;
  x.time = std::numeric_limits<double>::infinity();
  CHECK_FALSE(decode_progress(encode_progress(x)).ok());
  // Random bytes and random corruptions are refused or decoded, never a crash.
  std::mt19937_64 gen(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 2000; ++i) {
    auto b = good;
    if (i % 2 == 0) {
      b.resize(static_cast<size_t>(byte(gen) % 64));
      for (auto& c : b)
        c = static_cast<char>(byte(gen));
    } else {
      b[static_cast<size_t>(byte(gen)) % b.size()] = static_cast<char>(byte(gen));
    }
    auto d = decode_progress(b);
    if (d.ok()) {
      CHECK(std::isfinite(d->rate));
      CHECK(d->rate >= 0);
      CHECK(!d->peer.empty());
    }
  }
}

TEST_CASE("a record whose peer id differs from its sub-key is refused") {
  progress_tracker t("me", opts(100));
  progress_record b{"b", 0, 50, 5, 0, false, false};
  auto s = t.observe({entry(b, 60, "mallory"), {"c", {'x', 'y'}, 60}}, 0);
  CHECK(s.rejected == 2);
  CHECK(s.accepted == 0);
  CHECK(t.records().empty());
}

TEST_CASE("the local rate is an EMA of seconds per sample with bias correction") {
  local_progress lp(0.5);
  CHECK(lp.rate() == 0.0);
  lp.add(0, 0);  // starts the measurement
  lp.add(10, 1); // 0.1 s per sample
  CHECK(lp.rate() == doctest::Approx(10.0));
  lp.add(10, 3); // 0.2 s per sample: EMA 0.5·0.2 + 0.5·0.05 = 0.125; /(1 − 0.25) = 1/6
  CHECK(lp.rate() == doctest::Approx(6.0));
  // Several microbatches at one instant are measured together.
  lp.add(5, 3);
  CHECK(lp.rate() == doctest::Approx(6.0));
  lp.add(5, 4); // 10 samples over 1 s
  CHECK(lp.rate() > 6.0);
  CHECK(lp.samples() == 30);
  CHECK(lp.take() == 30);
  CHECK(lp.samples() == 0);
  // A pause is not counted as slow work.
  auto r = lp.rate();
  lp.idle(100);
  lp.add(10, 101);
  CHECK(lp.rate() > r);
}

TEST_CASE("a presumption carried over steps lives as long as the newer record that shows its "
          "peer at work") {
  // Steps faster than records: b is presumed at step 1, then 2, while the reads still return its
  // records from step 0 and 1. Kept to the first record's expiry, the presumption of a peer at
  // work emptied the views of 61 of 64 peers at once one record lifetime after the start.
  auto run = [](uint64_t newer_samples) {
    progress_tracker t("a", opts(100));
    progress_record b{"b", 0, 10, 10, 0, false, false};
    t.observe({entry(b, 30)}, 0.5);
    t.presume_stepped(0, 1);
    // The next read still holds b's record of step 0, made before the step ended.
    t.observe({entry(b, 30)}, 1.2);
    t.presume_stepped(1, 2);
    // Then a record of step 1 (made at 1.8, before the second step ended, stored until 31.8):
    // b at work (samples accumulated) or idle (none).
    progress_record newer{"b", 1, newer_samples, 12, 1.8, false, false};
    t.observe({entry(newer, 31.8)}, 2.5);
    REQUIRE(t.records().size() == 1);
    CHECK(t.records()[0].presumed);
    CHECK(t.records()[0].record.step == 2);
    CHECK(t.records()[0].record.rate == 12); // the newer rate either way
    return t.records()[0].expires_at;
  };
  CHECK(run(5) == 31.8);
  CHECK(run(0) == 30); // no sign of work since: the old expiry stays
  // Counted until then, and not after.
  progress_tracker t("a", opts(100));
  progress_record b{"b", 0, 10, 10, 0, false, false};
  t.observe({entry(b, 30)}, 0.5);
  t.presume_stepped(0, 1);
  progress_record newer{"b", 0, 20, 10, 0.9, false, false};
  t.observe({entry(newer, 30.9)}, 1.5);
  CHECK(t.estimate(1, 0, 0, 30.5).peers == 2);
  CHECK(t.estimate(1, 0, 0, 30.95).peers == 1);
}

} // namespace starling::test::actors_progress_test
