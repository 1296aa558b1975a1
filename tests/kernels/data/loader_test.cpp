#include "kernels/data/loader.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace starling::test::kernels_loader_test {

using namespace starling::kernels;

namespace {

sample_loader make_loader(uint64_t samples, uint64_t seed, uint64_t shards, uint64_t shard,
                          shard_layout layout = shard_layout::scattered) {
  loader_options o;
  o.seed = seed;
  o.shards = shards;
  o.shard = shard;
  o.layout = layout;
  auto l = sample_loader::make(samples, o);
  REQUIRE_MESSAGE(l.ok(), (l.ok() ? "" : l.error().what));
  return *l;
}

/// The ids of a shard, from its first epoch.
std::set<uint64_t> shard_ids(sample_loader l) {
  auto ids = l.next(l.shard_size());
  return {ids.begin(), ids.end()};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("every sample of a shard comes exactly once per epoch, batches crossing epochs") {
  for (auto layout : {shard_layout::contiguous, shard_layout::scattered}) {
    for (uint64_t shard = 0; shard < 3; ++shard) {
      auto l = make_loader(1000, 11, 3, shard, layout);
      const auto owned = shard_ids(l);
      REQUIRE(owned.size() == l.shard_size());
      // Batches of 7 do not divide the shard size (333 or 334): they straddle epoch ends.
      std::vector<uint64_t> stream;
      while (stream.size() < 3 * l.shard_size())
        l.next_into(7, stream);
      std::vector<std::vector<uint64_t>> epochs;
      for (uint64_t e = 0; e < 3; ++e) {
        std::vector<uint64_t> epoch(stream.begin() + e * l.shard_size(),
                                    stream.begin() + (e + 1) * l.shard_size());
        std::multiset<uint64_t> counted(epoch.begin(), epoch.end());
        CHECK(std::set<uint64_t>(epoch.begin(), epoch.end()) == owned);
        CHECK(counted.size() == owned.size()); // no repeats inside the epoch
        epochs.push_back(epoch);
      }
      CHECK(epochs[0] != epochs[1]); // each epoch reshuffles
      CHECK(epochs[1] != epochs[2]);
      for (auto id : owned)
        CHECK(l.owns(id));
    }
  }
}

TEST_CASE("shards are disjoint and cover every sample, in both layouts") {
  for (auto layout : {shard_layout::contiguous, shard_layout::scattered}) {
    const uint64_t n = 1003, shards = 4;
    std::vector<int> owner_count(n, 0);
    uint64_t total = 0;
    for (uint64_t k = 0; k < shards; ++k) {
      auto l = make_loader(n, 5, shards, k, layout);
      total += l.shard_size();
      for (auto id : shard_ids(l)) {
        REQUIRE(id < n);
        ++owner_count[id];
      }
    }
    CHECK(total == n);
    CHECK(std::all_of(owner_count.begin(), owner_count.end(), [](int c) { return c == 1; }));
    for (uint64_t id = 0; id < n; ++id) {
      int owners = 0;
      for (uint64_t k = 0; k < shards; ++k)
        owners += make_loader(n, 5, shards, k, layout).owns(id);
      CHECK(owners == 1);
    }
  }
}

TEST_CASE("a contiguous shard owns one range, a scattered one spreads over the data set") {
  auto c = shard_ids(make_loader(1000, 3, 4, 1, shard_layout::contiguous));
  CHECK(*c.begin() == 250);
  CHECK(*c.rbegin() == 499);
  auto s = shard_ids(make_loader(1000, 3, 4, 1, shard_layout::scattered));
  for (uint64_t quarter = 0; quarter < 4; ++quarter) {
    auto in = std::count_if(s.begin(), s.end(), [&](uint64_t id) { return id / 250 == quarter; });
    CHECK(in > 20); // ~62 expected; a contiguous shard would have 0 or 250
    CHECK(in < 150);
  }
}

TEST_CASE("a loader restored from a saved position yields exactly the uninterrupted continuation") {
  for (auto layout : {shard_layout::contiguous, shard_layout::scattered}) {
    // Stop points inside the first epoch, on an epoch end, and in a later epoch.
    for (uint64_t stop_batches : {1u, 5u, 43u, 101u}) {
      auto uninterrupted = make_loader(2000, 9, 3, 2, layout); // shard of 667 samples
      std::vector<uint64_t> before, expected;
      for (uint64_t b = 0; b < stop_batches; ++b)
        uninterrupted.next_into(16, before);
      const std::string saved = uninterrupted.save_position();
      for (int b = 0; b < 60; ++b)
        uninterrupted.next_into(16, expected);

      // A fresh process: same configuration, position from the bytes.
      auto resumed = make_loader(2000, 9, 3, 2, layout);
      auto st = resumed.restore_position(saved);
      REQUIRE_MESSAGE(st.ok(), st.what());
      CHECK(resumed.position() == resumed.advanced({0, 0}, stop_batches * 16));
      std::vector<uint64_t> got;
      for (int b = 0; b < 60; ++b)
        resumed.next_into(16, got);
      CHECK(got == expected);
      CHECK(resumed.position() == uninterrupted.position());
    }
  }
}

TEST_CASE("a saved position is a few bytes") {
  auto l = make_loader(100'000'000, 42, 64, 63);
  REQUIRE(l.seek(l.advanced({0, 0}, 10'000'000)).ok());
  CHECK(l.position().epoch == 6);
  CHECK(l.save_position().size() <= 16);
}

TEST_CASE("a position saved by another configuration or damaged is refused with a reason") {
  auto l = make_loader(1000, 1, 4, 2);
  l.next(10);
  const auto saved = l.save_position();
  const auto before = l.position();

  auto other_shard = make_loader(1000, 1, 4, 1);
  auto st = other_shard.restore_position(saved);
  CHECK_FALSE(st.ok());
  CHECK(contains(st.what(), "saved for shard 2 of 4"));
  CHECK(contains(st.what(), "this loader is shard 1 of 4"));
  CHECK(other_shard.position() == loader_position{});

  CHECK_FALSE(make_loader(1000, 2, 4, 2).restore_position(saved).ok()); // other seed
  CHECK_FALSE(make_loader(1001, 1, 4, 2).restore_position(saved).ok()); // other data set
  CHECK_FALSE(make_loader(1000, 1, 4, 2, shard_layout::contiguous).restore_position(saved).ok());

  CHECK(contains(l.restore_position(saved.substr(0, saved.size() - 1)).what(), "truncated"));
  CHECK(contains(l.restore_position(saved + "x").what(), "follow"));
  CHECK(contains(l.restore_position("").what(), "empty"));
  auto bad_version = saved;
  bad_version[0] = 9;
  CHECK(contains(l.restore_position(bad_version).what(), "version 9"));
  CHECK(l.position() == before);
  CHECK_FALSE(l.seek({0, 250}).ok()); // the shard has 250 samples
  CHECK(l.seek({3, 249}).ok());
}

TEST_CASE("different seeds give different orders, the same seed the same order") {
  auto a = make_loader(500, 1, 1, 0).next(500);
  auto b = make_loader(500, 1, 1, 0).next(500);
  auto c = make_loader(500, 2, 1, 0).next(500);
  CHECK(a == b);
  CHECK(a != c);
  std::vector<uint64_t> identity(500);
  for (uint64_t i = 0; i < 500; ++i)
    identity[i] = i;
  CHECK(a != identity);
  // Also for a contiguous layout, whose membership does not depend on the seed.
  CHECK(make_loader(500, 1, 2, 0, shard_layout::contiguous).next(250) !=
        make_loader(500, 2, 2, 0, shard_layout::contiguous).next(250));
}

TEST_CASE("the stateless batch of (seed, step, peer) is reproducible and equals the loader's") {
  loader_options o;
  o.seed = 77;
  o.shards = 5;
  o.shard = 3;
  const uint64_t n = 10'000, batch = 32;
  auto l = make_loader(n, 77, 5, 3);
  for (uint64_t step = 0; step < 130; ++step) { // 130·32 > 2000: into the third epoch
    auto streamed = l.next(batch);
    auto pure = batch_for_step(n, o, step, batch);
    REQUIRE(pure.ok());
    CHECK(*pure == streamed);
    CHECK(*batch_for_step(n, o, step, batch) == *pure);
  }
  // A validator recomputes another peer's batch from public values only.
  auto peer1 = batch_for_step(n, loader_options{77, 5, 1, shard_layout::scattered}, 9, batch);
  auto peer3 = batch_for_step(n, o, 9, batch);
  REQUIRE(peer1.ok());
  for (auto id : *peer1)
    CHECK(std::find(peer3->begin(), peer3->end(), id) == peer3->end());
  CHECK_FALSE(batch_for_step(n, o, UINT64_MAX, 2).ok()); // step·batch overflows
  CHECK(l.batch_at_step(0, batch).ok());
}

TEST_CASE("loader pinned order: changing it breaks --resume of saved runs") {
  // If this fails, the permutation or key derivation changed; saved positions of earlier runs
  // then continue with different samples. Change these values only with the position version.
  CHECK(make_loader(1000, 42, 1, 0).next(5) == std::vector<uint64_t>{821, 102, 381, 808, 89});
}

TEST_CASE("invalid loader configurations are refused") {
  CHECK_FALSE(sample_loader::make(0, {}).ok());
  CHECK_FALSE(sample_loader::make(10, loader_options{0, 0, 0, shard_layout::scattered}).ok());
  CHECK_FALSE(sample_loader::make(10, loader_options{0, 2, 2, shard_layout::scattered}).ok());
  auto many = sample_loader::make(3, loader_options{0, 4, 0, shard_layout::scattered});
  REQUIRE_FALSE(many.ok());
  CHECK(contains(many.error().what, "4 shards of 3 samples"));
  CHECK_FALSE(sample_loader::make((uint64_t{1} << 62) + 1, {}).ok());
  CHECK(sample_loader::make(1, {}).ok());
}

} // namespace starling::test::kernels_loader_test
