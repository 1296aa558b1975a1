// Adaptive compression: the codec that finishes a round soonest within the error budget, from
// profiles and throughput measurements (numbers given, no clock).
#include "actors/averager/codec_choice.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <torch/torch.h>

namespace starling::test::actors_codec_choice_test {

using namespace starling;
using namespace starling::actors::averager;
using kernels::codec_id;

namespace {

/// Profiles like the ones measured on this machine: fp32 costs nothing to encode, 8-bit costs
/// CPU time and an error near 1%.
codec_chooser typical(double budget = 1e-2) {
  codec_choice_options o;
  o.error_budget = budget;
  codec_chooser c(o);
  c.set_profile({codec_id::none, 4.0, 0.0, 0.0});
  c.set_profile({codec_id::fp16, 2.0, 2e-9, 3e-4});
  c.set_profile({codec_id::blockwise8, 1.0 + 4.0 / 4096, 6e-9, 8e-3});
  return c;
}

} // namespace

TEST_CASE("codec choice: uncompressed on a fast link, 8-bit on a slow one, fp16 in between") {
  auto c = typical();
  const int64_t n = int64_t{16} << 20;
  // Nothing measured yet: the fewest bytes within the budget.
  CHECK(c.choose(n, 4) == codec_id::blockwise8);
  c.observe(3e9, 1.0); // loopback: 3 GB/s
  CHECK(c.choose(n, 4) == codec_id::none);
  codec_chooser slow = typical();
  slow.observe(24e6, 1.0); // 191 Mbit/s
  CHECK(slow.choose(n, 4) == codec_id::blockwise8);
  codec_chooser mid = typical();
  mid.observe(400e6, 1.0); // fp16 halves the bytes for little CPU; 8-bit costs more CPU
  CHECK(mid.choose(n, 4) == codec_id::fp16);
  // The estimates say why: fp32 over 191 Mbit/s takes ~4 s for 16M floats in a group of 4.
  CHECK(slow.estimated_seconds(codec_id::none, n, 4) == doctest::Approx(4.19).epsilon(0.01));
}

TEST_CASE("codec choice: a codec over the error budget is never chosen, none always fits") {
  auto tight = typical(1e-3);
  tight.observe(24e6, 1.0);
  CHECK(tight.choose(int64_t{1} << 24, 4) == codec_id::fp16);
  auto strict = typical(1e-5);
  strict.observe(24e6, 1.0);
  CHECK(strict.choose(int64_t{1} << 24, 4) == codec_id::none);
  // The result's error estimate grows with the compressed result chunk: sqrt(1 + 1/n).
  CHECK(tight.estimated_error(codec_id::blockwise8, 4) == doctest::Approx(8e-3 * std::sqrt(1.25)));
  // Unprofiled: none.
  codec_chooser empty;
  CHECK(empty.choose(1000, 2) == codec_id::none);
}

TEST_CASE("codec choice: the throughput estimate follows measurements, ignoring empty ones") {
  codec_choice_options o;
  o.smoothing = 0.5;
  codec_chooser c(o);
  CHECK_FALSE(c.throughput());
  c.observe(100, 1);
  c.observe(0, 1);
  c.observe(100, 0);
  REQUIRE(c.throughput());
  CHECK(*c.throughput() == doctest::Approx(100));
  c.observe(300, 1);
  CHECK(*c.throughput() == doctest::Approx(200));
}

TEST_CASE("measure_codec: sizes and errors of real codecs on random data") {
  torch::manual_seed(4);
  auto x = torch::randn({1 << 16});
  double t = 0;
  auto clock = [&t] { return t += 0.001; };
  auto none = measure_codec(x, codec_id::none, {}, clock);
  REQUIRE(none);
  CHECK(none->bytes_per_element == doctest::Approx(4.0));
  CHECK(none->relative_error == 0);
  CHECK(none->seconds_per_element == doctest::Approx(0.001 / (1 << 16)));
  auto bw8 = measure_codec(x, codec_id::blockwise8, {}, clock);
  REQUIRE(bw8);
  CHECK(bw8->bytes_per_element < 1.01);
  CHECK(bw8->relative_error > 1e-3);
  CHECK(bw8->relative_error < 1e-2);
  auto fp16 = measure_codec(x, codec_id::fp16, {}, clock);
  REQUIRE(fp16);
  CHECK(fp16->relative_error < 1e-3);
  CHECK_FALSE(measure_codec(torch::ones({2, 2}), codec_id::none, {}, clock));
}

TEST_CASE("measure_codec: the CPU cost is the fastest of three timings (a preempted one is "
          "left out)") {
  torch::manual_seed(5);
  auto x = torch::randn({1 << 12});
  // Timings of 40 ms (the process lost its core), then 2 ms and 3 ms.
  std::vector<double> ticks{0.0, 0.040, 1.0, 1.002, 2.0, 2.003};
  size_t i = 0;
  auto clock = [&] { return ticks.at(i++); };
  auto p = measure_codec(x, codec_id::blockwise8, {}, clock);
  REQUIRE(p);
  CHECK(i == ticks.size());
  CHECK(p->seconds_per_element == doctest::Approx(0.002 / (1 << 12)));
}

TEST_CASE("codec choice: observed rounds decide, the uncompressed codec is tried once") {
  const int64_t n = int64_t{16} << 20;
  // One host, memory-bound links: the 8-bit round moved a quarter of the bytes and took 0.087
  // s, which alone reads as 290 MB/s and makes fp32 look like 0.35 s; fp32 takes 0.06 s.
  auto host = typical();
  std::string picks;
  auto round = [&](codec_chooser& c, double seconds_none, double seconds_fp16,
                   double seconds_bw8) {
    auto k = c.choose(n, 4);
    picks += std::string{picks.empty() ? "" : " "} + std::string{kernels::to_string(k)};
    auto s = k == codec_id::none ? seconds_none : k == codec_id::fp16 ? seconds_fp16 : seconds_bw8;
    c.observe_round(k, n, 4, s);
  };
  for (int i = 0; i < 5; ++i)
    round(host, 0.06, 0.091, 0.087);
  CHECK(picks == "blockwise8 none fp16 none none");
  // 200 Mbit/s links: fp32 is tried once (5 s) and 8-bit keeps the rounds; fp16, which the
  // links' measured speed puts at about 2.5 s, is not tried.
  picks.clear();
  auto slow = typical();
  for (int i = 0; i < 5; ++i)
    round(slow, 5.0, 2.5, 1.3);
  CHECK(picks == "blockwise8 none blockwise8 blockwise8 blockwise8");
}

TEST_CASE("codec choice: a codec that lost is tried again once its observation is stale") {
  const int64_t n = int64_t{16} << 20;
  codec_choice_options o;
  o.candidates = {codec_id::none, codec_id::blockwise8};
  o.retry_after = 4;
  o.retry_ratio = 1.5;
  codec_chooser c(o);
  c.set_profile({codec_id::none, 4.0, 0.0, 0.0});
  c.set_profile({codec_id::blockwise8, 1.0 + 4.0 / 4096, 6e-9, 8e-3});
  std::string picks;
  auto round = [&](double seconds_none, double seconds_bw8) {
    auto k = c.choose(n, 4);
    picks += std::string{picks.empty() ? "" : " "} + std::string{kernels::to_string(k)};
    c.observe_round(k, n, 4, k == codec_id::none ? seconds_none : seconds_bw8);
  };
  // The uncompressed round is slowed once (0.12 s, a process that lost its core) and 8-bit
  // wins; once that observation is four rounds old fp32 (within 1.5x) is tried again, its fresh
  // 0.06 s replaces the stale 0.12 s, and it keeps the rounds; 8-bit, stale and within 1.5x in
  // turn, is retried once.
  round(0.12, 0.087); // blockwise8: nothing measured yet
  round(0.12, 0.087); // none, tried once: slowed
  for (int i = 0; i < 9; ++i)
    round(0.06, 0.087);
  CHECK(picks
        == "blockwise8 none blockwise8 blockwise8 blockwise8 blockwise8 none none none none "
           "blockwise8");
  CHECK(c.rounds() == 11);
  // A codec several times slower is not retried: fp32 over 200 Mbit/s links (5 s against 1.3 s).
  codec_chooser slow(o);
  slow.set_profile({codec_id::none, 4.0, 0.0, 0.0});
  slow.set_profile({codec_id::blockwise8, 1.0 + 4.0 / 4096, 6e-9, 8e-3});
  int fp32_rounds = 0;
  for (int i = 0; i < 40; ++i) {
    auto k = slow.choose(n, 4);
    fp32_rounds += k == codec_id::none;
    slow.observe_round(k, n, 4, k == codec_id::none ? 5.0 : 1.3);
  }
  CHECK(fp32_rounds == 1);
  // retry_after 0: never.
  o.retry_after = 0;
  codec_chooser never(o);
  never.set_profile({codec_id::none, 4.0, 0.0, 0.0});
  never.set_profile({codec_id::blockwise8, 1.0 + 4.0 / 4096, 6e-9, 8e-3});
  picks.clear();
  int none_rounds = 0;
  for (int i = 0; i < 20; ++i) {
    auto k = never.choose(n, 4);
    none_rounds += k == codec_id::none;
    never.observe_round(k, n, 4, k == codec_id::none ? (i < 2 ? 0.12 : 0.06) : 0.087);
  }
  CHECK(none_rounds == 1);
}

TEST_CASE("codec choice: same-host links take the uncompressed codec without exploring") {
  const int64_t n = int64_t{16} << 20;
  auto c = typical();
  c.set_links_local(true);
  CHECK(c.links_local());
  // Before any measurement (remote links would start with the fewest bytes) and after a
  // compressed round that looked faster.
  CHECK(c.choose(n, 4) == codec_id::none);
  c.observe_round(codec_id::blockwise8, n, 4, 0.05);
  c.observe_round(codec_id::none, n, 4, 0.07);
  CHECK(c.choose(n, 4) == codec_id::none);
  CHECK(c.describe(n, 4).find("same-host") != std::string::npos);
  // A group with a remote member: the observations decide again.
  c.set_links_local(false);
  CHECK(c.choose(n, 4) == codec_id::blockwise8);
}

} // namespace starling::test::actors_codec_choice_test
