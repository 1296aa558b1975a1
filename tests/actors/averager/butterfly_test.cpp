#include "actors/averager/butterfly.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <random>

#include <torch/torch.h>

namespace starling::test::actors_butterfly_test {

using namespace starling::actors::averager;

namespace {

std::vector<member_info> group(const std::vector<double>& bw, const std::vector<bool>& aux = {}) {
  std::vector<member_info> out;
  for (size_t i = 0; i < bw.size(); ++i)
    out.push_back({"p" + std::to_string(i), bw[i], i < aux.size() && aux[i]});
  return out;
}

} // namespace

TEST_CASE("a round plan covers the vector with one contiguous part per member") {
  auto p = make_plan(group({1, 0, 2, 1}), 1000);
  REQUIRE(p.ok());
  CHECK(p->sizes.size() == 4);
  CHECK(p->sizes[1] == 0); // client mode reduces nothing
  CHECK(std::accumulate(p->sizes.begin(), p->sizes.end(), int64_t{0}) == 1000);
  for (size_t i = 1; i < 4; ++i)
    CHECK(p->offsets[i] == p->offsets[i - 1] + p->sizes[i - 1]);
  CHECK(p->sizes[2] > p->sizes[0]);
  CHECK(p->senders() == std::vector<size_t>{0, 1, 2, 3});
}

TEST_CASE("a round plan rejects bad groups and accepts an empty vector") {
  CHECK_FALSE(make_plan({}, 10).ok());
  CHECK_FALSE(make_plan(group({0, 0}), 10).ok());
  CHECK_FALSE(make_plan(group({1, -1}), 10).ok());
  CHECK_FALSE(make_plan(group({1, 1}, {true, true}), 10).ok());
  auto e = make_plan(group({1, 1}), 0);
  REQUIRE(e.ok());
  CHECK(e->sizes == std::vector<int64_t>{0, 0});
  auto one = make_plan(group({1}), 7);
  REQUIRE(one.ok());
  CHECK(one->sizes == std::vector<int64_t>{7});
  auto aux = make_plan(group({1, 1, 1}, {false, true, false}), 30);
  REQUIRE(aux.ok());
  CHECK(aux->senders() == std::vector<size_t>{0, 2});
  CHECK(aux->sizes[1] > 0); // auxiliary members reduce
}

TEST_CASE("a kept-chunks reducer counts only complete contributions") {
  // A custom kernel (here the weighted mean as a kernel) gets whole contributions.
  part_reducer r(6, {0, 1, 2}, weighted_mean_reducer());
  auto a = torch::arange(6, torch::kFloat32);
  auto b = torch::full({6}, 10.0f);
  REQUIRE(r.add(0, 1.0, 0, a.narrow(0, 0, 4)).ok());
  CHECK_FALSE(r.complete());
  REQUIRE(r.add(0, 1.0, 4, a.narrow(0, 4, 2)).ok());
  REQUIRE(r.add(1, 3.0, 0, b).ok());
  CHECK_FALSE(r.complete());
  // peer 2 sends half, then dies: its partial data is excluded.
  REQUIRE(r.add(2, 5.0, 0, torch::full({3}, 1000.0f)).ok());
  r.exclude(2);
  CHECK(r.complete());
  CHECK(r.contributors() == std::vector<size_t>{0, 1});
  auto out = r.reduce();
  REQUIRE(out.ok());
  auto expect = (a * 1 + b * 3) / 4;
  CHECK(torch::allclose(out->values, expect, 1e-6, 1e-6));
  REQUIRE(out->segments.size() == 1);
  CHECK(out->segments[0].offset == 0);
  CHECK(out->segments[0].size == 6);
  CHECK(out->segments[0].contributors == std::vector<uint32_t>{0, 1});
  CHECK_FALSE(r.reduce().ok()); // once
}

TEST_CASE("the streamed weighted mean counts a failed sender where it delivered") {
  auto buffer = torch::full({6}, 123.0f); // a reused buffer: old contents must not leak in
  auto storage = buffer.data_ptr();
  part_reducer r(6, {0, 1, 2}, nullptr, buffer);
  auto a = torch::arange(6, torch::kFloat32);
  auto b = torch::full({6}, 10.0f);
  // Chunks out of order: peer 0's second chunk first.
  REQUIRE(r.add(0, 1.0, 4, a.narrow(0, 4, 2)).ok());
  REQUIRE(r.add(0, 1.0, 0, a.narrow(0, 0, 4)).ok());
  REQUIRE(r.add(1, 3.0, 0, b).ok());
  // Peer 2 delivers elements [0, 3), then dies.
  REQUIRE(r.add(2, 5.0, 0, torch::full({3}, 1000.0f)).ok());
  CHECK_FALSE(r.complete());
  r.exclude(2);
  CHECK(r.complete());
  CHECK_FALSE(r.add(2, 5.0, 3, torch::full({3}, 1000.0f)).ok()); // excluded
  CHECK(r.contributors() == std::vector<size_t>{0, 1});
  auto out = r.reduce();
  REQUIRE(out.ok());
  CHECK(out->values.data_ptr() == storage); // reduced into the given buffer
  auto expect = (a * 1 + b * 3) / 4;
  expect.narrow(0, 0, 3).copy_((a.narrow(0, 0, 3) + b.narrow(0, 0, 3) * 3 + 5000) / 9);
  CHECK(torch::allclose(out->values, expect, 1e-6, 1e-6));
  REQUIRE(out->segments.size() == 2);
  CHECK(out->segments[0].offset == 0);
  CHECK(out->segments[0].size == 3);
  CHECK(out->segments[0].contributors == std::vector<uint32_t>{0, 1, 2});
  CHECK(out->segments[1].offset == 3);
  CHECK(out->segments[1].size == 3);
  CHECK(out->segments[1].contributors == std::vector<uint32_t>{0, 1});
  CHECK(common_contributors(out->segments) == std::vector<uint32_t>{0, 1});
  CHECK_FALSE(r.add(1, 3.0, 0, b).ok()); // after the reduction
}

TEST_CASE("the streamed weighted mean fails on elements nobody reached or of weight 0") {
  part_reducer gap(4, {0, 1}, nullptr);
  REQUIRE(gap.add(0, 1.0, 0, torch::ones({2})).ok());
  gap.exclude(0);
  gap.exclude(1);
  auto g = gap.reduce();
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().what.find("[2, 4)") != std::string::npos);
  part_reducer zero(4, {0, 1}, nullptr);
  REQUIRE(zero.add(0, 1.0, 0, torch::ones({2})).ok());
  REQUIRE(zero.add(1, 0.0, 0, torch::ones({4})).ok());
  zero.exclude(0);
  auto z = zero.reduce();
  REQUIRE_FALSE(z.ok());
  CHECK(z.error().what.find("sum to 0") != std::string::npos);
}

TEST_CASE("a streamed sender's chunks in any order and sizes average exactly") {
  // Random chunkings of 3 senders with weights; the result is the weighted mean everywhere.
  torch::manual_seed(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t size = 1000;
    std::vector<torch::Tensor> xs;
    std::vector<double> ws = {0.333, 0.1667, 0.5003};
    part_reducer r(size, {0, 1, 2}, nullptr);
    std::mt19937 rng(trial);
    for (size_t p = 0; p < 3; ++p) {
      xs.push_back(torch::randn({size}));
      std::vector<std::pair<int64_t, int64_t>> chunks;
      for (int64_t off = 0; off < size;) {
        auto n = std::min<int64_t>(size - off, 1 + static_cast<int64_t>(rng() % 300));
        chunks.emplace_back(off, n);
        off += n;
      }
      std::shuffle(chunks.begin(), chunks.end(), rng);
      for (auto& [off, n] : chunks)
        REQUIRE(r.add(p, ws[p], off, xs[p].narrow(0, off, n)).ok());
    }
    CHECK(r.complete());
    auto out = r.reduce();
    REQUIRE(out.ok());
    auto expect = (xs[0] * ws[0] + xs[1] * ws[1] + xs[2] * ws[2]) / (ws[0] + ws[1] + ws[2]);
    CHECK((out->values - expect).abs().max().item<float>() < 1e-6f);
    REQUIRE(out->segments.size() == 1);
    CHECK(out->segments[0].size == size);
  }
}

TEST_CASE("a streamed sum in a reused buffer starts from its first whole chunk or from zero") {
  // The buffer comes from an earlier round (here: NaN everywhere); whichever chunk comes first
  // (whole part, partial, of weight 0), nothing of the old contents may reach the result.
  const int64_t size = 64;
  torch::manual_seed(3);
  auto a = torch::randn({size});
  auto b = torch::randn({size});
  struct order {
    bool whole_first;
    double wa;
  };
  for (auto o : {order{true, 3.0}, order{false, 3.0}, order{true, 1.0}, order{true, 0.0},
                 order{false, 0.0}}) {
    part_reducer r(size, {0, 1}, nullptr, torch::full({size}, NAN));
    auto add_b = [&] {
      REQUIRE(r.add(1, 1.0, 40, b.narrow(0, 40, size - 40)).ok());
      REQUIRE(r.add(1, 1.0, 0, b.narrow(0, 0, 40)).ok());
    };
    if (!o.whole_first)
      add_b();
    REQUIRE(r.add(0, o.wa, 0, a).ok());
    if (o.whole_first)
      add_b();
    auto out = r.reduce();
    REQUIRE(out.ok());
    auto expect = (a * o.wa + b) / (o.wa + 1.0);
    CHECK((out->values - expect).abs().max().item<float>() < 1e-6f);
  }
  // Only a sender of weight 0 delivered: the sum is 0 everywhere and the mean fails (not NaN
  // from the old buffer passing for a result).
  part_reducer z(size, {0}, nullptr, torch::full({size}, NAN));
  REQUIRE(z.add(0, 0.0, 0, a).ok());
  CHECK_FALSE(z.reduce().ok());
}

TEST_CASE("a part reducer rejects bad chunks without changing its state") {
  part_reducer r(4, {0, 1}, nullptr);
  auto x = torch::ones({2});
  CHECK_FALSE(r.add(5, 1.0, 0, x).ok());                    // unexpected peer
  CHECK_FALSE(r.add(0, -1.0, 0, x).ok());                   // negative weight
  CHECK_FALSE(r.add(0, NAN, 0, x).ok());                    // non-finite weight
  CHECK_FALSE(r.add(0, 1.0, 3, x).ok());                    // outside the part
  CHECK_FALSE(r.add(0, 1.0, -1, x).ok());                   // negative offset
  CHECK_FALSE(r.add(0, 1.0, 0, torch::ones({2, 1})).ok());  // not 1-D
  CHECK_FALSE(r.add(0, 1.0, 0, torch::full({2}, INFINITY)).ok());
  REQUIRE(r.add(0, 1.0, 0, x).ok());
  CHECK_FALSE(r.add(0, 1.0, 1, x).ok());                    // overlap
  CHECK_FALSE(r.add(0, 2.0, 2, x).ok());                    // weight changed
  REQUIRE(r.add(0, 1.0, 2, x).ok());
  r.exclude(1);
  CHECK_FALSE(r.add(1, 1.0, 0, x).ok());                    // excluded
  r.exclude(0);                                             // complete: stays
  CHECK(r.contributors() == std::vector<size_t>{0});
  auto out = r.reduce();
  REQUIRE(out.ok());
  CHECK(torch::equal(out->values, torch::ones({4})));
}

TEST_CASE("a part reducer with no usable contribution fails instead of inventing values") {
  part_reducer none(3, {0, 1}, nullptr);
  none.exclude(0);
  none.exclude(1);
  CHECK(none.complete());
  CHECK_FALSE(none.reduce().ok());
  part_reducer zero(3, {0}, nullptr);
  REQUIRE(zero.add(0, 0.0, 0, torch::ones({3})).ok());
  CHECK_FALSE(zero.reduce().ok()); // weighted mean of total weight 0
}

TEST_CASE("the reduction is pluggable: CenteredClip resists an outlier the mean does not") {
  std::vector<torch::Tensor> xs = {torch::zeros({4}), torch::full({4}, 0.1f),
                                   torch::full({4}, -0.1f), torch::full({4}, 1000.0f)};
  starling::kernels::centered_clip_options o;
  o.tau = 1.0;
  part_reducer clip(4, {0, 1, 2, 3}, centered_clip_reducer(o));
  part_reducer mean(4, {0, 1, 2, 3}, weighted_mean_reducer());
  for (size_t i = 0; i < xs.size(); ++i) {
    REQUIRE(clip.add(i, 1.0, 0, xs[i]).ok());
    REQUIRE(mean.add(i, 1.0, 0, xs[i]).ok());
  }
  auto c = clip.reduce();
  auto m = mean.reduce();
  REQUIRE(c.ok());
  REQUIRE(m.ok());
  CHECK(c->values.abs().max().item<float>() < 1.0f);
  CHECK(m->values.abs().max().item<float>() > 100.0f);
}

TEST_CASE("a round report counts non-empty parts and derives the outcome") {
  round_report r;
  r.parts.resize(4);
  r.parts[0].size = 5;
  r.parts[0].status = part_status::averaged;
  r.parts[1].size = 0; // client: not counted
  r.parts[2].size = 5;
  r.parts[2].status = part_status::averaged;
  r.parts[3].size = 5;
  r.parts[3].status = part_status::averaged;
  finish_report(r);
  CHECK(r.averaged == 3);
  CHECK(r.outcome == round_outcome::complete);
  r.parts[3].status = part_status::own_value_kept;
  r.parts[2].status = part_status::failed;
  finish_report(r);
  CHECK(r.averaged == 1);
  CHECK(r.kept == 1);
  CHECK(r.failed == 1);
  CHECK(r.outcome == round_outcome::partial);
  CHECK(summary(r).find("partial") != std::string::npos);
}

TEST_CASE("a range set merges neighbours, refuses overlaps and answers coverage") {
  range_set r;
  CHECK(r.insert(10, 20).ok());
  CHECK(r.insert(30, 40).ok());
  CHECK(r.insert(20, 30).ok()); // joins both neighbours
  CHECK(r.ranges().size() == 1);
  CHECK(r.size() == 30);
  CHECK(r.covers(10, 40));
  CHECK(r.covers(15, 16));
  CHECK_FALSE(r.covers(9, 11));
  CHECK_FALSE(r.covers(39, 41));
  CHECK(r.covers(5, 5)); // empty
  CHECK_FALSE(r.insert(39, 45).ok());
  CHECK_FALSE(r.insert(0, 11).ok());
  CHECK_FALSE(r.insert(12, 13).ok());
  CHECK(r.size() == 30); // unchanged by refusals
  CHECK(r.insert(0, 10).ok());
  CHECK(r.insert(45, 50).ok());
  CHECK(r.ranges().size() == 2);
  CHECK_FALSE(r.covers(0, 50)); // the gap [40, 45)
  CHECK(r.insert(7, 7).ok());   // empty: no-op
  CHECK(r.size() == 45);
}

TEST_CASE("a part reducer tells a resent chunk from a new one") {
  part_reducer r(8, {0, 1}, nullptr);
  auto x = torch::ones({4});
  REQUIRE(r.add(0, 1.0, 0, x).ok());
  CHECK(r.has(0, 0, 4));
  CHECK(r.has(0, 1, 2));
  CHECK_FALSE(r.has(0, 2, 4)); // half new
  CHECK_FALSE(r.has(1, 0, 4)); // another sender
  CHECK_FALSE(r.has(7, 0, 4)); // not a sender
  CHECK_FALSE(r.has(0, 0, 0)); // nothing to duplicate
  CHECK_FALSE(r.add(0, 1.0, 0, x).ok()); // adding it again is refused (the averager skips it)
  REQUIRE(r.add(0, 1.0, 4, x * 3).ok());
  REQUIRE(r.add(1, 1.0, 0, torch::full({8}, 5.0f)).ok());
  CHECK(r.complete());
  auto out = r.reduce();
  REQUIRE(out.ok());
  auto expect = torch::cat({torch::full({4}, 3.0f), torch::full({4}, 4.0f)});
  CHECK(torch::equal(out->values, expect));
}

} // namespace starling::test::actors_butterfly_test
