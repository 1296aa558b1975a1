// Top-k parts (actors/averager/sparse_parts.hpp): the lossless sparse chunk form, the reducer's
// whole-vector error feedback applied slice by slice as part ranges change, and butterfly rounds
// of sparse vectors whose parts move between rounds, every member ending with the same bytes.
#include "actors/averager/sparse_parts.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <deque>
#include <memory>
#include <random>

#include <torch/torch.h>

#include "actors/averager/round_engine.hpp"

namespace starling::test::actors_sparse_parts_test {

using namespace starling::actors::averager;

namespace {

/// A random fp32 vector of `n` elements with about `density` of them nonzero.
torch::Tensor sparse_vector(int64_t n, double density, uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  auto values = torch::randn({n}, g, torch::kFloat);
  auto keep = torch::rand({n}, g, torch::kFloat) < density;
  return values * keep.to(torch::kFloat);
}

/// Queues the engines' chunks; the test delivers them in order.
struct queue_sink : round_sink {
  std::deque<std::pair<uint32_t, out_chunk_ptr>>* queue = nullptr;
  void send(uint32_t to, const out_chunk_ptr& c) override { queue->push_back({to, c}); }
};

} // namespace

TEST_CASE("a sparse chunk carries exactly its nonzeros, packed, and refuses malformed bytes") {
  for (uint64_t seed : {1, 2, 3}) {
    auto x = sparse_vector(5000, 0.005 * static_cast<double>(seed), seed);
    auto nnz = x.count_nonzero().item<int64_t>();
    auto bytes = encode_sparse_chunk(x);
    REQUIRE(bytes.ok());
    // Varint gaps and fp32 values: under 8 bytes per nonzero (Top-k's raw layout) plus the counts.
    CHECK(bytes->size() < 4 + 8 * static_cast<size_t>(nnz));
    CHECK(bytes->size() >= 3 + 5 * static_cast<size_t>(nnz));
    auto back = decode_sparse_chunk(bytes->data(), bytes->size(), 5000);
    REQUIRE(back.ok());
    CHECK(torch::equal(*back, x));
    CHECK_FALSE(decode_sparse_chunk(bytes->data(), bytes->size(), 4999).ok()); // too large
    CHECK_FALSE(decode_sparse_chunk(bytes->data(), bytes->size() - 1, 5000).ok());
    CHECK_FALSE(decode_sparse_chunk(bytes->data(), 2, 5000).ok());
    CHECK_FALSE(decode_sparse_chunk(bytes->data(), 0, 5000).ok());
    auto bad = *bytes;
    bad[2] = 0; // k = 0 (5000 takes two varint bytes; k of up to 127 one)
    CHECK_FALSE(decode_sparse_chunk(bad.data(), bad.size(), 5000).ok());
    std::vector<uint8_t> endless(12, 0xff); // a count that never ends
    CHECK_FALSE(decode_sparse_chunk(endless.data(), endless.size(), 5000).ok());
  }
  auto zeros = encode_sparse_chunk(torch::zeros({10}));
  REQUIRE(zeros.ok());
  auto z = decode_sparse_chunk(zeros->data(), zeros->size(), 10);
  REQUIRE(z.ok());
  CHECK(torch::equal(*z, torch::zeros({10})));
  CHECK_FALSE(encode_sparse_chunk(torch::full({3}, std::nan(""))).ok());
}

TEST_CASE("a reducer's residual covers the whole vector; each part uses and updates its slice") {
  const int64_t n = 1000;
  sparse_part_finisher f(0.05, true);
  auto total_in = torch::zeros({n});
  auto total_out = torch::zeros({n});
  // The ranges move as a group's membership and bandwidths would move them.
  std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 600}, {400, 600}, {0, 1000}, {250, 300}, {700, 300}};
  uint64_t seed = 10;
  for (auto [lo, size] : ranges) {
    auto before = f.residual().defined() ? f.residual().clone() : torch::zeros({n});
    auto in = torch::randn({size}, at::detail::createCPUGenerator(seed++));
    auto v = in.clone();
    REQUIRE(f.finish(n, lo, v).ok());
    // Top-k of the part: ⌈ratio · size⌉ coordinates kept.
    CHECK(v.count_nonzero().item<int64_t>() == static_cast<int64_t>(std::ceil(0.05 * size)));
    // Inside the part: what went out plus what stays owed is what came in plus what was owed.
    auto after = f.residual();
    CHECK(torch::allclose(v + after.narrow(0, lo, size), in + before.narrow(0, lo, size), 1e-6,
                          1e-6));
    // Outside it the residual is untouched.
    auto outside = torch::ones({n}, torch::kBool);
    outside.narrow(0, lo, size).fill_(false);
    CHECK(torch::equal(after.masked_select(outside), before.masked_select(outside)));
    total_in.narrow(0, lo, size).add_(in);
    total_out.narrow(0, lo, size).add_(v);
  }
  // Nothing is lost across the changing ranges: sent + owed = given, coordinate by coordinate.
  CHECK(torch::allclose(total_out + f.residual(), total_in, 1e-5, 1e-5));
  // Another vector size starts over.
  auto v = torch::randn({10});
  REQUIRE(f.finish(10, 0, v).ok());
  CHECK(f.residual().numel() == 10);
  auto w = torch::randn({5});
  CHECK_FALSE(f.finish(10, 6, w).ok());
  // Without error feedback only Top-k.
  sparse_part_finisher plain(0.1, false);
  auto p = torch::randn({100});
  auto q = p.clone();
  REQUIRE(plain.finish(100, 0, q).ok());
  CHECK(q.count_nonzero().item<int64_t>() == 10);
  CHECK(!plain.residual().defined());
}

TEST_CASE("butterfly rounds of Top-k parts whose ranges change give every member the same "
          "re-sparsified average") {
  const int64_t n = 4000;
  const double ratio = 0.01;
  const uint32_t members = 3;
  // One finisher per member for the whole run (its averager's), whatever part it reduces.
  std::vector<sparse_part_finisher> finishers(members, sparse_part_finisher(ratio, true));
  std::vector<sparse_part_finisher> expected(members, sparse_part_finisher(ratio, true));
  // Bandwidths change between rounds, so the parts do; member 2 is a client in the last round.
  std::vector<std::vector<double>> bandwidths = {{1, 1, 1}, {3, 1, 1}, {1, 2, 0}};
  uint64_t seed = 100;
  for (uint64_t round = 0; round < bandwidths.size(); ++round) {
    std::vector<messages::member_info> info;
    for (uint32_t i = 0; i < members; ++i)
      info.push_back({"m" + std::to_string(i), bandwidths[round][i], false});
    auto plan = make_plan(info, n);
    REQUIRE(plan.ok());
    std::vector<torch::Tensor> inputs;
    std::vector<double> weights = {1, 2, 3};
    for (uint32_t i = 0; i < members; ++i)
      inputs.push_back(sparse_vector(n, ratio, seed++));
    std::deque<std::pair<uint32_t, out_chunk_ptr>> queue;
    std::vector<queue_sink> sinks(members);
    std::vector<std::unique_ptr<round_engine>> engines;
    for (uint32_t i = 0; i < members; ++i) {
      sinks[i].queue = &queue;
      round_engine_options eo;
      eo.chunk_elems = 700; // several chunks per part
      eo.finish_part = [&finishers, i](int64_t offset, at::Tensor& v) {
        return finishers[i].finish(n, offset, v);
      };
      engines.push_back(
          std::make_unique<round_engine>(round + 1, *plan, i, inputs[i], weights[i], eo, sinks[i]));
    }
    for (uint32_t i = 0; i < members; ++i)
      for (uint32_t j = 0; j < members; ++j)
        if (i != j)
          engines[i]->open(j, 0);
    uint64_t bytes = 0;
    while (!queue.empty()) {
      auto [to, c] = queue.front();
      queue.pop_front();
      // Over the wire as the averager sends a Top-k round's chunks.
      auto wire = encode_sparse_chunk(c->values);
      REQUIRE(wire.ok());
      bytes += wire->size();
      auto values = decode_sparse_chunk(wire->data(), wire->size(), n);
      REQUIRE(values.ok());
      engines[to]->on_chunk(c->meta, *values);
    }
    // The reference: each part's weighted mean, re-sparsified by its reducer's own residual.
    auto mean = (inputs[0] * 1 + inputs[1] * 2 + inputs[2] * 3) / 6;
    auto want = torch::zeros({n});
    for (uint32_t j = 0; j < members; ++j) {
      auto size = plan->sizes[j];
      if (size == 0)
        continue;
      auto part = mean.narrow(0, plan->offsets[j], size).clone();
      REQUIRE(expected[j].finish(n, plan->offsets[j], part).ok());
      want.narrow(0, plan->offsets[j], size).copy_(part);
    }
    for (uint32_t i = 0; i < members; ++i) {
      CAPTURE(round);
      CAPTURE(i);
      REQUIRE(engines[i]->ready());
      auto r = engines[i]->result();
      for (auto& p : r.parts)
        CHECK(p.status == messages::part_status::averaged);
      CHECK(torch::allclose(r.values, want, 1e-6, 1e-6));
      // The same bytes on every member.
      CHECK(torch::equal(r.values, engines[0]->result().values));
    }
    // Sparse both ways: far fewer bytes than the dense vector once per member.
    CHECK(bytes * 10 < static_cast<uint64_t>(n) * 4 * members);
  }
  for (uint32_t j = 0; j < members; ++j)
    CHECK(torch::allclose(finishers[j].residual(), expected[j].residual(), 1e-6, 1e-6));
}

} // namespace starling::test::actors_sparse_parts_test
