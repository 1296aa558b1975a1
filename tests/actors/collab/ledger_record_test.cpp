#include "actors/collab/ledger_record.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

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
  for (char v : {1, 3}) {
    auto version = bytes;
    version[0] = v;
    CHECK_FALSE(decode_summary(version).ok());
  }
  auto flags = bytes;
  flags[1] = 8;
  CHECK_FALSE(decode_summary(flags).ok());
  // The sample has no loss and no step: flagging one makes its 0 a value (canonical), while an
  // absent one that is not +0.0 is refused, and so is a non-finite loss or a stage above 4095.
  auto tail = bytes.size() - 19; // loss, step (doubles), stage (u16), empty token id (u8)
  auto with_loss = bytes;
  with_loss[1] = 2;
  CHECK(decode_summary(with_loss).ok());
  auto stray = bytes;
  put_double(stray, tail, -0.0);
  CHECK_FALSE(decode_summary(stray).ok());
  stray = bytes;
  put_double(stray, tail + 8, 3);
  CHECK_FALSE(decode_summary(stray).ok());
  auto inf = bytes;
  inf[1] = 2;
  put_double(inf, tail, std::numeric_limits<double>::infinity());
  CHECK_FALSE(decode_summary(inf).ok());
  auto step = bytes;
  step[1] = 4;
  put_double(step, tail + 8, -2);
  CHECK_FALSE(decode_summary(step).ok());
  auto stage = bytes;
  stage[tail + 16] = static_cast<char>(0x00);
  stage[tail + 17] = static_cast<char>(0x10); // 4096
  CHECK_FALSE(decode_summary(stage).ok());
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
  // The credit count (u16) sits right before the first credit: name length 2 ("p0") + 8, and
  // the loss, step, stage and token id after it.
  auto at = one.size() - 19 - (1 + 2 + 8) - 2;
  one[at] = static_cast<char>(max_ledger_credits + 1);
  CHECK_FALSE(decode_summary(one).ok());
}

TEST_CASE("a summary carries a loss, a step and a SWARM stage, or says it has none") {
  auto s = sample();
  auto d = decode_summary(encode_summary(s));
  REQUIRE(d.ok());
  CHECK(std::isnan(d->loss));
  CHECK(d->step < 0);
  CHECK(d->stage < 0);
  s.loss = 2.75;
  s.step = 41;
  s.stage = 2;
  auto bytes = encode_summary(s);
  d = decode_summary(bytes);
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().what));
  CHECK(d->loss == 2.75);
  CHECK(d->step == 41);
  CHECK(d->stage == 2);
  CHECK(encode_summary(*d) == bytes);
  s.token_id = "0123456789abcdef0123456789abcdef";
  bytes = encode_summary(s);
  d = decode_summary(bytes);
  REQUIRE(d.ok());
  CHECK(d->token_id == s.token_id);
  CHECK(encode_summary(*d) == bytes);
  // A token id that is not hex is refused by the decoder (the encoder leaves it out).
  auto upper = bytes;
  upper[upper.size() - 1] = 'F';
  CHECK_FALSE(decode_summary(upper).ok());
  auto cut = bytes;
  cut.pop_back();
  CHECK_FALSE(decode_summary(cut).ok());
  s.token_id = "not hex";
  d = decode_summary(encode_summary(s));
  REQUIRE(d.ok());
  CHECK(d->token_id.empty());
  // What cannot be carried is left out rather than refused by every reader.
  s.loss = std::numeric_limits<double>::infinity();
  s.step = -3;
  s.stage = max_ledger_stage + 1;
  d = decode_summary(encode_summary(s));
  REQUIRE(d.ok());
  CHECK(std::isnan(d->loss));
  CHECK(d->step < 0);
  CHECK(d->stage < 0);
}

TEST_CASE("a stage credits a trainer under the tag its microbatch ids carry") {
  auto tag = trainer_tag("trainer.1");
  CHECK(tag < (uint64_t{1} << 24));
  uint64_t id = (tag << 40) | 12345;
  CHECK(trainer_credit_name(id) == trainer_credit_name_of("trainer.1"));
  CHECK(trainer_credit_name(id).size() == 9);
  CHECK(trainer_credit_name(id).rfind("mb:", 0) == 0);
  CHECK(trainer_credit_name_of("trainer.0") != trainer_credit_name_of("trainer.1"));
}

TEST_CASE("two trainers whose names' tags collide get distinct tags, the same on every node") {
  // The first pair of `trainer.<i>` names whose 24-bit tags collide (a birthday collision comes
  // within a few thousand names).
  std::map<uint64_t, std::string> seen;
  std::string first, second;
  for (int i = 0; i < 200000 && second.empty(); ++i) {
    auto name = "trainer." + std::to_string(i);
    auto [it, fresh] = seen.emplace(trainer_tag(name), name);
    if (!fresh) {
      first = it->second;
      second = name;
    }
  }
  REQUIRE_FALSE(second.empty());
  REQUIRE(trainer_tag(first) == trainer_tag(second));
  MESSAGE(first << " and " << second << " share tag " << trainer_tag(first));
  // Every trainer up to the collision: distinct tags; the earlier name keeps its own tag, the
  // later one is drawn again; the order given does not matter.
  std::vector<std::string> names;
  for (auto& [tag, name] : seen)
    names.push_back(name);
  names.push_back(second);
  auto tags = trainer_tags(names);
  REQUIRE(tags.size() == names.size());
  std::set<uint64_t> distinct;
  for (auto& [name, tag] : tags) {
    CHECK(tag < (uint64_t{1} << 24));
    distinct.insert(tag);
  }
  CHECK(distinct.size() == names.size());
  CHECK(tags.at(first) == trainer_tag(first));
  CHECK(tags.at(second) != trainer_tag(second));
  std::vector<std::string> reversed(names.rbegin(), names.rend());
  CHECK(trainer_tags(reversed) == tags);
  // Trainers added later (higher indices) leave the others' tags as they were.
  auto more = names;
  for (int i = 0; i < 50; ++i)
    more.push_back("trainer.9" + std::to_string(1000000 + i));
  auto grown = trainer_tags(more);
  for (auto& [name, tag] : tags)
    CHECK(grown.at(name) == tag);
  // Without a collision every trainer keeps its name's tag (runs that had none are unchanged).
  auto plain = trainer_tags({"trainer.0", "trainer.1", "trainer.2"});
  for (auto& [name, tag] : plain)
    CHECK(tag == trainer_tag(name));
  CHECK(trainer_credit_name_of_tag(tags.at(second)) == trainer_credit_name(tags.at(second) << 40));
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

TEST_CASE("a gate record decodes to what was encoded, only from its own sub-key, and its decoder "
          "refuses every cut, bad counts, bad names, duplicates and extra bytes") {
  gate_summary g;
  g.id = "gate|[owner:" + std::string(64, 'a') + "]";
  g.time = 12.5;
  g.started = 2;
  g.others = 3;
  g.by_reason = {{"banned", 4}, {"no_hello", 2}};
  g.parties = {{"0123456789abcdef", 4, "banned: a NaN part at step 2"},
               {"fedcba9876543210", 2, ""}};
  auto bytes = encode_gate_summary(g);
  auto back = decode_gate_record(g.id, bytes);
  REQUIRE_MESSAGE(back.ok(), back.error().what);
  CHECK(back->id == g.id);
  CHECK(back->time == 12.5);
  CHECK(back->started == 2);
  CHECK(back->others == 3);
  CHECK(back->by_reason == g.by_reason);
  REQUIRE(back->parties.size() == 2);
  CHECK(back->parties[0].peer_id == "0123456789abcdef");
  CHECK(back->parties[0].refusals == 4);
  CHECK(back->parties[0].ban_reason == "banned: a NaN part at step 2");
  CHECK(back->parties[1].ban_reason.empty());
  CHECK_FALSE(decode_gate_record("gate|other", bytes).ok());
  // Every cut fails, and so does one extra byte.
  for (size_t n = 0; n < bytes.size(); ++n)
    CHECK_FALSE(decode_gate_summary({bytes.begin(), bytes.begin() + static_cast<long>(n)}).ok());
  auto longer = bytes;
  longer.push_back(0);
  CHECK_FALSE(decode_gate_summary(longer).ok());
  auto wrong_version = bytes;
  wrong_version[0] = 2;
  CHECK_FALSE(decode_gate_summary(wrong_version).ok());
  // Values the encoder writes as given but the decoder must refuse.
  auto refused = [](const gate_summary& x) {
    return !decode_gate_summary(encode_gate_summary(x)).ok();
  };
  auto x = g;
  x.others = -1;
  CHECK(refused(x));
  x = g;
  x.time = std::nan("");
  CHECK(refused(x));
  x = g;
  x.parties[1].refusals = std::numeric_limits<double>::infinity();
  CHECK(refused(x));
  x = g;
  x.by_reason["banned"] = 1e300;
  CHECK(refused(x));
  x = g;
  x.parties[1].peer_id = x.parties[0].peer_id; // listed twice
  CHECK(refused(x));
  // The encoder leaves out what it cannot carry (a reason that is not [a-z0-9_], a peer id that
  // is not lower-case hex) and cuts lists to their bounds.
  x = g;
  x.by_reason["Not ok"] = 1;
  x.parties.push_back({"NOT-HEX", 1, ""});
  for (size_t i = 0; i < max_gate_parties + 5; ++i) {
    char id[24];
    std::snprintf(id, sizeof id, "%016zx", i + 100);
    x.parties.push_back({id, 1, ""});
  }
  auto cut = decode_gate_summary(encode_gate_summary(x));
  REQUIRE_MESSAGE(cut.ok(), cut.error().what);
  CHECK(cut->by_reason.size() == 2);
  CHECK(cut->parties.size() == max_gate_parties);
  CHECK(gate_ledger_key("exp") == "exp/ledger/gates");
}

} // namespace starling::test::actors_ledger_record_test
