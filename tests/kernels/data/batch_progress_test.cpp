#include "kernels/data/batch_progress.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace starling::test::kernels_batch_progress_test {

using namespace starling::kernels;

TEST_CASE("batches done out of order move the watermark once the gap below them closes") {
  batch_progress p{10};
  CHECK(p.next_undone(0) == 0);
  REQUIRE(p.mark_done(2).ok());
  REQUIRE(p.mark_done(1).ok());
  CHECK(p.watermark() == 0);
  CHECK(p.done_count() == 2);
  CHECK(p.next_undone(0) == 0);
  CHECK(p.next_undone(1) == 3);
  REQUIRE(p.mark_done(0).ok());
  CHECK(p.watermark() == 3);
  CHECK(p.done(2));
  CHECK_FALSE(p.done(3));
  CHECK(p.next_undone(0) == 3);
}

TEST_CASE("a repeated batch is reported as a repeat and counts once") {
  batch_progress p{4};
  auto first = p.mark_done(3);
  REQUIRE(first.ok());
  CHECK(*first);
  auto again = p.mark_done(3);
  REQUIRE(again.ok());
  CHECK_FALSE(*again);
  CHECK(p.done_count() == 1);
  auto out = p.mark_done(4);
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().what.find("batch 4 is out of range") != std::string::npos);
}

TEST_CASE("a restarted trainer redoes exactly the batches not done") {
  // Batches complete in a shuffled order, as with several in flight; progress is saved and
  // restored half way, and the restored cursor walks exactly the rest.
  std::mt19937_64 rng{5};
  std::vector<uint64_t> order(200);
  for (uint64_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  batch_progress p{200};
  for (size_t i = 0; i < 120; ++i)
    REQUIRE(p.mark_done(order[i]).ok());
  auto restored = batch_progress::parse(p.serialize());
  REQUIRE(restored.ok());
  CHECK(*restored == p);
  std::vector<uint64_t> redo;
  for (auto b = restored->next_undone(0); b < restored->total(); b = restored->next_undone(b + 1))
    redo.push_back(b);
  std::vector<uint64_t> expected(order.begin() + 120, order.end());
  std::sort(expected.begin(), expected.end());
  CHECK(redo == expected);
  for (auto b : redo)
    REQUIRE(restored->mark_done(b).ok());
  CHECK(restored->complete());
  CHECK(restored->next_undone(0) == 200);
  // A finished shard serializes to a few bytes whatever its size.
  CHECK(restored->serialize().size() <= 8);
}

TEST_CASE("malformed progress bytes are refused with the reason") {
  batch_progress p{100};
  REQUIRE(p.mark_done(5).ok());
  REQUIRE(p.mark_done(7).ok());
  auto good = p.serialize();
  auto reason = [](std::string_view bytes) {
    auto r = batch_progress::parse(bytes);
    REQUIRE_FALSE(r.ok());
    return r.error().what;
  };
  CHECK(reason("").find("no bytes") != std::string::npos);
  CHECK(reason(std::string(1, '\x02')).find("version 2") != std::string::npos);
  CHECK(reason(good.substr(0, good.size() - 1)).find("truncated") != std::string::npos);
  CHECK(reason(good + "x").find("trailing") != std::string::npos);
  // total 3, watermark 4
  CHECK(reason(std::string{'\x01', '\x03', '\x04', '\x00'}).find("past the total")
        != std::string::npos);
  // total 3, watermark 0, one done batch with gap 5: batch 6
  CHECK(reason(std::string{'\x01', '\x03', '\x00', '\x01', '\x05'}).find("past the total")
        != std::string::npos);
}

TEST_CASE("progress resized to another total keeps the done batches below it") {
  batch_progress p{10};
  for (auto b : {0, 1, 2, 5, 8})
    REQUIRE(p.mark_done(static_cast<uint64_t>(b)).ok());
  auto shorter = p.resized(6);
  CHECK(shorter.total() == 6);
  CHECK(shorter.done_count() == 4);
  CHECK(shorter.next_undone(0) == 3);
  CHECK(shorter.next_undone(4) == 4);
  CHECK(shorter.next_undone(5) == 6);
  auto longer = p.resized(20);
  CHECK(longer.done_count() == 5);
  CHECK(longer.done(8));
  CHECK_FALSE(longer.done(10));
  REQUIRE(longer.mark_done(3).ok());
  REQUIRE(longer.mark_done(4).ok());
  CHECK(longer.watermark() == 6);
  batch_progress full{3};
  for (uint64_t b = 0; b < 3; ++b)
    REQUIRE(full.mark_done(b).ok());
  auto grown = full.resized(5);
  CHECK(grown.watermark() == 3);
  CHECK(grown.next_undone(0) == 3);
}

} // namespace starling::test::kernels_batch_progress_test
