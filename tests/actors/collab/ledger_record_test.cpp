#include "actors/collab/ledger_record.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace starling::test::actors_ledger_record_test {

using namespace starling::actors::collab;

namespace {

contribution_summary sample() {
  contribution_summary s;
  s.id = "@1/dedloc.1|[owner:ab]";
  s.name = "dedloc.1";
  s.time = 100.25;
  s.started = 90;
  s.computed = 640;
  s.dropped = 32;
  s.rounds = 9;
  s.rounds_averaged = 8;
  s.bytes_sent = 123456;
  s.bytes_received = 654321;
  s.credits = {{"dedloc.0", 300}, {"dedloc.2", 120.5}};
  s.credits_other = 4;
  return s;
}

/// Overwrites the double at byte `at` of `v`.
void put_double(std::vector<char>& v, size_t at, double x) {
  std::memcpy(v.data() + at, &x, 8);
}

} // namespace

TEST_CASE("a contribution summary decodes to what was encoded, and only from its own sub-key") {
  auto s = sample();
  s.left = true;
  auto bytes = encode_summary(s);
  auto d = decode_summary_record(s.id, bytes);
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().what));
  CHECK(d->id == s.id);
  CHECK(d->name == s.name);
  CHECK(d->time == s.time);
  CHECK(d->started == s.started);
  CHECK(d->computed == s.computed);
  CHECK(d->dropped == s.dropped);
  CHECK(d->rounds_averaged == s.rounds_averaged);
  CHECK(d->bytes_received == s.bytes_received);
  CHECK(d->credits_other == s.credits_other);
  CHECK(d->left);
  REQUIRE(d->credits.size() == 2);
  CHECK(d->credits[1].peer == "dedloc.2");
  CHECK(d->credits[1].samples == 120.5);
  CHECK(encode_summary(*d) == bytes);
  // A record stored under another peer's sub-key is that peer's lie about someone else.
  auto other = decode_summary_record("@2/dedloc.2|[owner:cd]", bytes);
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().what.find("sub-key") != std::string::npos);
}

TEST_CASE("a summary decoder refuses every cut, a wrong version or flag, bad counts and extra "
          "credits") {
  auto bytes = encode_summary(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_FALSE(decode_summary(cut).ok());
  }
  auto trailing = bytes;
  trailing.push_back(0);
  CHECK_FALSE(decode_summary(trailing).ok());
  auto version = bytes;
  version[0] = 2;
  CHECK_FALSE(decode_summary(version).ok());
  auto flags = bytes;
  flags[1] = 2;
  CHECK_FALSE(decode_summary(flags).ok());
  // The counts start at byte 2 + 16 (after the two times): computed, dropped, ...
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e17}) {
    auto b = bytes;
    put_double(b, 18, bad);
    CHECK_FALSE(decode_summary(b).ok());
  }
  auto time = bytes;
  put_double(time, 2, std::numeric_limits<double>::infinity());
  CHECK_FALSE(decode_summary(time).ok());
  // More dropped samples than computed ones is no honest summary.
  auto s = sample();
  s.dropped = s.computed + 1;
  CHECK_FALSE(decode_summary(encode_summary(s)).ok());
  // An empty name.
  s = sample();
  s.name.clear();
  CHECK_FALSE(decode_summary(encode_summary(s)).ok());
  // The encoder keeps at most max_ledger_credits; a forged count above it is refused.
  s = sample();
  s.credits.clear();
  for (size_t i = 0; i < max_ledger_credits + 5; ++i)
    s.credits.push_back({"p" + std::to_string(i), 1});
  auto many = encode_summary(s);
  auto d = decode_summary(many);
  REQUIRE(d.ok());
  CHECK(d->credits.size() == max_ledger_credits);
  s.credits.resize(1);
  auto one = encode_summary(s);
  // The credit count (u16) sits right before the first credit: name length 2 ("p0") + 8.
  auto at = one.size() - (1 + 2 + 8) - 2;
  one[at] = static_cast<char>(max_ledger_credits + 1);
  CHECK_FALSE(decode_summary(one).ok());
}

TEST_CASE("partners credit a sender with its whole weight over a complete round, a share over "
          "a partial one, and nothing for its own part") {
  // Four members, parts of sizes 10, 20, 30, 40; member 1 sent weight 64, member 3 weight 32.
  std::vector<int64_t> sizes{10, 20, 30, 40};
  double credited_1 = 0, credited_3 = 0;
  for (uint32_t k = 0; k < 4; ++k) {
    std::vector<double> received{-1, 64, -1, 32};
    received[k] = 99; // its own contribution: never credited
    auto c = round_credits(sizes, received, k);
    CHECK(c[k] == 0);
    if (k != 1)
      credited_1 += c[1];
    if (k != 3)
      credited_3 += c[3];
  }
  CHECK(credited_1 == doctest::Approx(64));
  CHECK(credited_3 == doctest::Approx(32));
  // Member 2's part did not get member 1's contribution: member 1 gets the other partners' share.
  double partial = 0;
  for (uint32_t k : {0u, 3u})
    partial += round_credits(sizes, {-1, 64, -1, -1}, k)[1];
  CHECK(partial == doctest::Approx(64.0 * (10 + 40) / (10 + 30 + 40)));
  // A sender whose partners reduce nothing (clients) is credited nothing; bad weights count 0.
  CHECK(round_credits({10, 0}, {-1, 5}, 1)[0] == 0);
  auto bad = round_credits({10, 10, 10}, {std::nan(""), -3, 1e300 * 1e300}, 0);
  CHECK(bad[1] == 0);
  CHECK(bad[2] == 0);
  CHECK(round_credits({10, 10}, {1, 1}, 7) == std::vector<double>{0, 0});
}

TEST_CASE("a member's name comes from its averager's address, and shards spread ids") {
  CHECK(peer_of_member("@2/dedloc.3-avg1") == "dedloc.3");
  CHECK(peer_of_member("127.0.0.1:4000/dedloc.12-avg0") == "dedloc.12");
  CHECK(peer_of_member("@2/plain") == "plain");
  CHECK(peer_of_member("x-avg") == "x-avg");
  CHECK(peer_of_member("x-avgz") == "x-avgz");
  CHECK(ledger_key("exp", 7) == "exp/ledger/7");
  std::set<size_t> shards;
  for (int i = 0; i < 1000; ++i) {
    auto s = ledger_shard("@" + std::to_string(i) + "/dedloc." + std::to_string(i));
    CHECK(s < ledger_shards);
    shards.insert(s);
  }
  CHECK(shards.size() == ledger_shards);
  CHECK(ledger_shard("same") == ledger_shard("same"));
}

TEST_CASE("a credit book names its first 64 partners and sums the rest") {
  credit_book b;
  for (size_t i = 0; i < max_ledger_credits + 10; ++i)
    b.add("p" + std::to_string(i), 2);
  b.add("p0", 1);
  b.add("p1", std::nan(""));
  b.add("p2", -4);
  CHECK(b.named().size() == max_ledger_credits);
  CHECK(b.named().at("p0") == 3);
  CHECK(b.other() == 20);
  CHECK(b.list().size() == max_ledger_credits);
}

} // namespace starling::test::actors_ledger_record_test
