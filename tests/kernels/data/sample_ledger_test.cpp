#include "kernels/data/sample_ledger.hpp"

#include "kernels/data/loader.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>

namespace starling::test::kernels_sample_ledger_test {

using namespace starling::kernels;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Counts every id of `ledger` the slow way, to check the compact one against.
std::map<uint64_t, uint64_t> all_counts(const sample_ledger& ledger) {
  std::map<uint64_t, uint64_t> out;
  for (uint64_t id = 0; id < ledger.samples(); ++id)
    if (auto c = ledger.count(id))
      out[id] = c;
  return out;
}

} // namespace

TEST_CASE("the ledger counts samples trained once, duplicates and gaps") {
  sample_ledger l(10);
  for (uint64_t id : {0, 1, 2, 3, 5, 6, 7, 8})
    REQUIRE(l.record(id).ok());
  REQUIRE(l.record(3).ok()); // a duplicate
  REQUIRE(l.record(8, 2).ok());
  auto s = l.summary();
  CHECK(s.samples == 10);
  CHECK(s.once == 6);
  CHECK(s.more == 2);
  CHECK(s.never == 2); // ids 4 and 9
  CHECK(s.records == 11);
  CHECK(s.max_count == 3);
  CHECK(l.count(3) == 2);
  CHECK(l.count(4) == 0);
  CHECK(l.count(8) == 3);
  CHECK(s.describe() == "6 samples trained once, 2 twice or more, 2 not trained (of 10)");
  auto bad = l.record(10);
  CHECK_FALSE(bad.ok());
  CHECK(contains(bad.what(), "id 10 out of range"));
}

TEST_CASE("a run that trains each sample once says so") {
  auto loader = sample_loader::make(1000, {});
  REQUIRE(loader.ok());
  sample_ledger l(1000);
  for (int b = 0; b < 125; ++b)
    REQUIRE(l.record(loader->next(8)).ok());
  CHECK(l.summary().describe() == "1000 samples trained once, none twice or more, none not "
                                  "trained (of 1000)");
}

TEST_CASE("ledgers of shards merge into the run's, and a sample two peers trained counts twice") {
  const uint64_t n = 200'000; // several chunks of 2^16 ids
  std::vector<sample_ledger> peers;
  for (uint64_t k = 0; k < 4; ++k) {
    auto loader = sample_loader::make(n, loader_options{3, 4, k, shard_layout::scattered});
    REQUIRE(loader.ok());
    sample_ledger l(n);
    REQUIRE(l.record(loader->next(loader->shard_size())).ok());
    peers.push_back(std::move(l));
  }
  sample_ledger run(n);
  for (auto& p : peers)
    REQUIRE(run.merge(p).ok());
  CHECK(run.summary().once == n);
  CHECK(run.summary().more == 0);
  CHECK(run.memory_bytes() < 1024); // every chunk full: flags only

  REQUIRE(run.merge(peers[2]).ok()); // the same work reported twice
  CHECK(run.summary().more == peers[2].summary().once);
  CHECK(run.summary().max_count == 2);
  CHECK_FALSE(run.merge(sample_ledger(n + 1)).ok());
}

TEST_CASE("the compact ledger agrees with a plain count through arrays, bitmaps and full chunks") {
  const uint64_t n = 3 * sample_ledger::chunk_ids + 1000; // a short last chunk
  std::mt19937_64 gen(5);
  std::map<uint64_t, uint64_t> truth;
  sample_ledger l(n);
  // Chunk 0 sparse (array), chunk 1 dense (bitmap), chunk 3 (the short one) filled completely.
  std::uniform_int_distribution<uint64_t> in0(0, 65535), in1(65536, 2 * 65536 - 1);
  for (int i = 0; i < 1000; ++i) {
    auto id = in0(gen);
    ++truth[id];
    REQUIRE(l.record(id).ok());
  }
  for (int i = 0; i < 30000; ++i) {
    auto id = in1(gen);
    ++truth[id];
    REQUIRE(l.record(id).ok());
  }
  for (uint64_t id = 3 * 65536; id < n; ++id) {
    ++truth[id];
    REQUIRE(l.record(id).ok());
  }
  CHECK(all_counts(l) == truth);
  uint64_t once = 0, more = 0;
  for (auto& kv : truth)
    (kv.second == 1 ? once : more) += 1;
  CHECK(l.summary().once == once);
  CHECK(l.summary().more == more);
  CHECK(l.summary().never == n - truth.size());

  // Round trip through bytes.
  auto bytes = l.serialize();
  auto back = sample_ledger::parse(bytes);
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().what));
  CHECK(all_counts(*back) == truth);
  CHECK(back->serialize() == bytes);
}

TEST_CASE("a finished epoch of 10^7 samples serializes to a few bytes per chunk") {
  const uint64_t n = 10'000'000;
  sample_ledger l(n);
  bool all_in_range = true;
  for (uint64_t id = 0; id < n; ++id)
    all_in_range = l.record(id).ok() && all_in_range;
  CHECK(all_in_range);
  CHECK(l.summary().once == n);
  CHECK(l.serialize().size() < 400); // 153 chunks, 2 bytes each
  CHECK(l.memory_bytes() < 153 * 200);
}

TEST_CASE("malformed ledger bytes are refused") {
  sample_ledger l(100);
  REQUIRE(l.record(std::vector<uint64_t>{1, 2, 3, 3, 50}).ok());
  auto bytes = l.serialize();
  REQUIRE(sample_ledger::parse(bytes).ok());
  CHECK_FALSE(sample_ledger::parse("").ok());
  CHECK_FALSE(sample_ledger::parse(bytes + "x").ok());
  CHECK_FALSE(sample_ledger::parse(bytes.substr(0, bytes.size() - 2)).ok());
  auto bad_version = bytes;
  bad_version[0] = 7;
  auto r = sample_ledger::parse(bad_version);
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error().what, "version 7"));
  // The same bytes claiming a range of 40 ids: id 50 is out of it.
  auto shrunk = bytes;
  shrunk[1] = 40;
  CHECK_FALSE(sample_ledger::parse(shrunk).ok());
}

TEST_CASE("comparing trained with handed-out ids finds lost and doubled samples") {
  sample_ledger expected(100), trained(100);
  for (uint64_t id = 0; id < 50; ++id)
    REQUIRE(expected.record(id).ok());
  for (uint64_t id = 0; id < 50; ++id)
    if (id != 7 && id != 20)
      REQUIRE(trained.record(id).ok());
  REQUIRE(trained.record(30).ok()); // a retried microbatch applied twice
  REQUIRE(trained.record(60).ok()); // never handed out
  auto c = compare(trained, expected);
  CHECK(c.exact == 47);
  CHECK(c.missing == 2);
  CHECK(c.extra == 2);
  CHECK(c.first_missing == std::vector<uint64_t>{7, 20});
  CHECK(c.first_extra == std::vector<uint64_t>{30, 60});
  CHECK_FALSE(c.ok());
  CHECK(c.describe() ==
        "47 samples trained as expected, 2 missing (ids 7, 20), 2 extra (ids 30, 60)");
  auto same = compare(expected, expected);
  CHECK(same.ok());
  CHECK(same.exact == 50);
  // Two epochs expected, two trained: repeats that match are exact.
  sample_ledger once = expected;
  REQUIRE(expected.merge(expected).ok());
  CHECK(expected.count(0) == 2);
  CHECK(expected.count(49) == 2);
  CHECK(expected.count(50) == 0);
  auto one_short = compare(once, expected);
  CHECK(one_short.missing == 50);
  CHECK(one_short.exact == 0);
  REQUIRE(once.merge(once).ok());
  CHECK(compare(once, expected).ok());
  CHECK(compare(once, expected).exact == 50);
}

TEST_CASE("a run stopped mid-way and resumed from its saved position and ledger trains each "
          "requested sample once, none twice") {
  const uint64_t n = 5000, shards = 3, batch = 16, requested_batches = 150; // 2400 samples
  // First process: every shard trains 40 batches, then the run stops; what survives is bytes.
  std::vector<std::string> positions;
  std::string ledger_bytes;
  {
    sample_ledger trained(n);
    for (uint64_t k = 0; k < shards; ++k) {
      auto l = sample_loader::make(n, loader_options{42, shards, k, shard_layout::scattered});
      REQUIRE(l.ok());
      for (int b = 0; b < 40; ++b)
        REQUIRE(trained.record(l->next(batch)).ok());
      positions.push_back(l->save_position());
    }
    ledger_bytes = trained.serialize();
  }
  // Second process: restore, train the remaining batches.
  auto trained = sample_ledger::parse(ledger_bytes);
  REQUIRE(trained.ok());
  sample_ledger expected(n);
  for (uint64_t k = 0; k < shards; ++k) {
    auto l = sample_loader::make(n, loader_options{42, shards, k, shard_layout::scattered});
    REQUIRE(l.ok());
    REQUIRE(l->restore_position(positions[k]).ok());
    for (uint64_t b = 40; b < requested_batches / shards; ++b)
      REQUIRE(trained->record(l->next(batch)).ok());
    // What an uninterrupted run of this shard would have trained.
    auto fresh = sample_loader::make(n, loader_options{42, shards, k, shard_layout::scattered});
    REQUIRE(expected.record(fresh->next(batch * (requested_batches / shards))).ok());
  }
  auto c = compare(*trained, expected);
  CHECK(c.ok());
  CHECK(c.exact == 2400);
  CHECK(trained->summary().describe() ==
        "2400 samples trained once, none twice or more, 2600 not trained (of 5000)");
}

} // namespace starling::test::kernels_sample_ledger_test
