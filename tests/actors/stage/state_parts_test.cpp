// A stage's state cut into parts for a download from several donors (actors/stage/state_parts).
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <algorithm>

#include "actors/stage/state_parts.hpp"

namespace starling::test::actors_state_parts_test {

using namespace starling;
using actors::stage::assemble_state;
using actors::stage::cut_state_part;
using actors::stage::part_range;
using actors::stage::state_digest;
using messages::stage_state;
using messages::stage_state_part;

namespace {

stage_state make_state(int64_t numel, int64_t moments, uint64_t steps, uint64_t seed) {
  torch::manual_seed(seed);
  stage_state s;
  s.params.tensor = torch::randn({numel});
  s.moments.tensor = torch::rand({moments});
  s.optimizer_steps = {steps, steps, 0};
  s.steps = steps;
  s.samples = 1000 + steps;
  return s;
}

std::vector<stage_state_part> cut_all(const stage_state& s, uint64_t parts) {
  auto digest = state_digest(s);
  std::vector<stage_state_part> out;
  for (uint64_t i = 0; i < parts; ++i) {
    auto p = cut_state_part(s, digest, i, parts);
    REQUIRE(p.ok());
    out.push_back(*p);
  }
  return out;
}

} // namespace

TEST_CASE("part ranges are contiguous, near-equal and cover the whole") {
  for (uint64_t total : {0, 1, 7, 60, 1000, 1001}) {
    for (uint64_t parts = 1; parts <= actors::stage::max_state_parts; ++parts) {
      uint64_t next = 0, lo = total, hi = 0;
      for (uint64_t i = 0; i < parts; ++i) {
        auto [b, e] = part_range(total, i, parts);
        CHECK(b == next);
        CHECK(e >= b);
        lo = std::min(lo, e - b);
        hi = std::max(hi, e - b);
        next = e;
      }
      CHECK(next == total);
      CHECK(hi - lo <= 1);
    }
  }
}

TEST_CASE("a state cut into 1 to 16 parts assembles to the same bytes, in any order") {
  auto s = make_state(12345, 4099, 17, 1);
  for (uint64_t parts : {1, 2, 3, 5, 16}) {
    auto ps = cut_all(s, parts);
    std::reverse(ps.begin(), ps.end());
    auto whole = assemble_state(ps);
    REQUIRE_MESSAGE(whole.ok(), whole.error().what);
    CHECK(whole->steps == 17);
    CHECK(torch::equal(whole->params.tensor, s.params.tensor));
    CHECK(torch::equal(whole->moments.tensor, s.moments.tensor));
    CHECK(whole->optimizer_steps == s.optimizer_steps);
    CHECK(state_digest(*whole) == state_digest(s));
  }
}

TEST_CASE("states without parameters or optimizer cut and assemble") {
  stage_state s;
  s.steps = 4;
  auto whole = assemble_state(cut_all(s, 3));
  REQUIRE(whole.ok());
  CHECK(whole->steps == 4);
  CHECK(!whole->params.tensor.defined());
  CHECK(!whole->moments.tensor.defined());
}

TEST_CASE("a cost model's modeled state bytes are shared out over the parts and summed back") {
  auto s = make_state(100, 50, 3, 2);
  s.modeled.size = 1000003;
  auto ps = cut_all(s, 7);
  uint64_t sum = 0;
  for (auto& p : ps) {
    CHECK(p.modeled.size >= 1000003 / 7);
    CHECK(p.modeled.size <= 1000003 / 7 + 1);
    sum += p.modeled.size;
  }
  CHECK(sum == 1000003);
  auto whole = assemble_state(ps);
  REQUIRE(whole.ok());
  CHECK(whole->modeled.size == 1000003);
}

TEST_CASE("the digest changes with any byte, the step or the split between fields") {
  auto s = make_state(100, 50, 3, 2);
  auto d = state_digest(s);
  auto t = s;
  t.params.tensor = s.params.tensor.clone();
  t.params.tensor[7] += 1e-3;
  CHECK(state_digest(t) != d);
  t = s;
  t.moments.tensor = s.moments.tensor.clone();
  t.moments.tensor[49] += 1e-3;
  CHECK(state_digest(t) != d);
  t = s;
  t.optimizer_steps[2] = 1;
  CHECK(state_digest(t) != d);
  t = s;
  t.steps = 4;
  CHECK(state_digest(t) != d);
  CHECK(state_digest(s) == d);
}

TEST_CASE("parts of different states, missing, repeated or tampered parts are rejected") {
  auto a = make_state(1000, 300, 5, 3);
  auto b = make_state(1000, 300, 5, 4); // same step and sizes, other values (diverged replica)
  auto c = make_state(1000, 300, 6, 3); // one step later
  auto pa = cut_all(a, 3);
  auto pb = cut_all(b, 3);
  auto pc = cut_all(c, 3);
  SUBCASE("diverged replicas") {
    CHECK(!assemble_state({pa[0], pb[1], pa[2]}).ok());
  }
  SUBCASE("a donor one step later") {
    CHECK(!assemble_state({pa[0], pa[1], pc[2]}).ok());
  }
  SUBCASE("a missing part") {
    CHECK(!assemble_state({pa[0], pa[2]}).ok());
  }
  SUBCASE("a repeated part") {
    CHECK(!assemble_state({pa[0], pa[0], pa[2]}).ok());
  }
  SUBCASE("a part whose slice has the wrong length") {
    auto bad = pa;
    bad[1].params.tensor = bad[1].params.tensor.slice(0, 0, 10);
    CHECK(!assemble_state(bad).ok());
    bad = pa;
    bad[2].moments.tensor = bad[2].moments.tensor.slice(0, 1);
    CHECK(!assemble_state(bad).ok());
  }
  SUBCASE("a tampered value with the donors' digest") {
    auto bad = pa;
    bad[1].params.tensor = bad[1].params.tensor.clone();
    bad[1].params.tensor[0] += 1;
    auto r = assemble_state(bad);
    REQUIRE(!r.ok());
    CHECK(r.error().what.find("digest") != std::string::npos);
  }
  SUBCASE("a part index or count out of range") {
    auto bad = pa;
    bad[2].part = 3;
    CHECK(!assemble_state(bad).ok());
    CHECK(!cut_state_part(a, state_digest(a), 3, 3).ok());
    CHECK(!cut_state_part(a, state_digest(a), 0, 0).ok());
    CHECK(!cut_state_part(a, state_digest(a), 0, actors::stage::max_state_parts + 1).ok());
  }
  SUBCASE("a part with other optimizer step counts") {
    auto bad = pa;
    bad[1].optimizer_steps[0]++;
    CHECK(!assemble_state(bad).ok());
  }
  SUBCASE("a wrong dtype") {
    auto bad = pa;
    bad[0].params.tensor = bad[0].params.tensor.to(torch::kDouble);
    CHECK(!assemble_state(bad).ok());
  }
  SUBCASE("nothing") {
    CHECK(!assemble_state({}).ok());
  }
}

TEST_CASE("a state's buffers travel whole in every part and are covered by the digest") {
  auto s = make_state(1000, 2000, 5, 3);
  auto plain = state_digest(s);
  s.buffers.tensor = torch::rand({12});
  s.int_buffers.tensor = torch::tensor({int64_t{5}, int64_t{5}});
  CHECK(state_digest(s) != plain);
  auto parts = cut_all(s, 3);
  for (auto& p : parts)
    CHECK(p.buffers.tensor.equal(s.buffers.tensor));
  auto whole = assemble_state(parts);
  REQUIRE(whole.ok());
  CHECK(whole->buffers.tensor.equal(s.buffers.tensor));
  CHECK(whole->int_buffers.tensor.equal(s.int_buffers.tensor));
  // A donor whose running statistics differ sent a part of another state.
  parts[0].buffers.tensor = parts[0].buffers.tensor + 1;
  auto mixed = assemble_state(parts);
  REQUIRE_FALSE(mixed.ok());
  CHECK(mixed.error().what.find("does not match the donors' digest") != std::string::npos);
}

TEST_CASE("a lamb8 state's codes and scales are cut into byte slices and covered by the digest") {
  auto s = make_state(1000, 0, 5, 3);
  s.moments.tensor = torch::Tensor{};
  auto plain = state_digest(s);
  s.packed_moments = std::string(1001, 'c');
  s.packed_moments[500] = 'x';
  CHECK(state_digest(s) != plain);
  for (uint64_t n : {1, 3, 16}) {
    auto parts = cut_all(s, n);
    uint64_t sum = 0;
    for (auto& p : parts) {
      CHECK(p.packed_bytes == 1001);
      CHECK(p.moments_numel == 0);
      sum += p.packed_moments.size();
    }
    CHECK(sum == 1001);
    std::reverse(parts.begin(), parts.end());
    auto whole = assemble_state(parts);
    REQUIRE(whole.ok());
    CHECK(whole->packed_moments == s.packed_moments);
    CHECK_FALSE(whole->moments.tensor.defined());
  }
  // A slice of the wrong length, or other bytes, is refused.
  auto parts = cut_all(s, 3);
  parts[1].packed_moments.pop_back();
  auto short_part = assemble_state(parts);
  REQUIRE_FALSE(short_part.ok());
  CHECK(short_part.error().what.find("part 1 holds 333 bytes of the compact optimizer state, 334 "
                                     "expected")
        != std::string::npos);
  parts = cut_all(s, 3);
  parts[2].packed_moments[0] ^= 1;
  auto tampered = assemble_state(parts);
  REQUIRE_FALSE(tampered.ok());
  CHECK(tampered.error().what.find("does not match the donors' digest") != std::string::npos);
}

} // namespace starling::test::actors_state_parts_test
