#include "actors/btard/mprng.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/seeded_hash.hpp"

namespace starling::test::btard_mprng {

namespace btard = starling::actors::btard;

namespace {

/// A 32-byte key: enough for the MPRNG, which never signs.
std::string key(int i) {
  return std::string(31, 'k') + static_cast<char>('A' + i);
}

std::vector<std::string> keys(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back(key(i));
  return out;
}

btard::digest secret(uint64_t peer, uint32_t attempt) {
  return btard::hash_bytes("r" + std::to_string(peer) + "/" + std::to_string(attempt));
}

btard::mprng_round round_of(uint64_t step, uint32_t attempt, std::vector<std::string> ps) {
  auto r = btard::mprng_round::start(step, attempt, std::move(ps));
  REQUIRE(r);
  return std::move(*r);
}

btard::digest value_of(const btard::mprng_outcome& o) {
  REQUIRE(o.value);
  return *o.value;
}

} // namespace

TEST_CASE("all commit then all reveal: r_t is BLAKE2b of the reveals in key order") {
  const uint64_t step = 12;
  auto ps = keys(5);
  std::map<std::string, btard::digest> reveals;
  for (int i = 0; i < 5; ++i)
    reveals[key(i)] = secret(static_cast<uint64_t>(i), 0);
  // Two arrival orders give the same value.
  btard::digest first{};
  for (int order = 0; order < 2; ++order) {
    auto round = round_of(step, 0, ps);
    for (int j = 0; j < 5; ++j) {
      int i = order == 0 ? j : 4 - j;
      REQUIRE(round.add_commit(key(i), btard::mprng_commitment(step, 0, key(i), reveals[key(i)])));
    }
    CHECK(round.phase() == btard::mprng_phase::commits);
    for (int j = 0; j < 5; ++j) {
      int i = order == 0 ? j : (j * 3) % 5;
      REQUIRE(round.add_reveal(key(i), reveals[key(i)]));
    }
    CHECK(round.complete());
    auto out = round.finish();
    CHECK(out.withholders.empty());
    CHECK(out.silent.empty());
    if (order == 0)
      first = value_of(out);
    else
      CHECK(value_of(out) == first);
  }
  CHECK(first == btard::mprng_value(step, 0, reveals));
  // Spelled out: tag, step, attempt, count, then (key, r) in key order.
  std::string in = "starling.btard.mprng.value.v1";
  for (uint64_t f : {step})
    for (int b = 0; b < 8; ++b)
      in.push_back(static_cast<char>((f >> (8 * b)) & 0xff));
  in.append(4, '\0');
  in.push_back(5);
  in.append(7, '\0');
  for (const auto& [k, r] : reveals)
    in += k + btard::digest_string(r);
  CHECK(first == btard::hash_bytes(in));
  // Any one reveal changes the value.
  auto changed = reveals;
  changed[key(3)] = secret(99, 0);
  CHECK(btard::mprng_value(step, 0, changed) != first);
}

TEST_CASE("a withheld reveal names the withholder and the redraw runs without it") {
  const uint64_t step = 3;
  auto round = round_of(step, 0, keys(4));
  for (int i = 0; i < 4; ++i)
    REQUIRE(round.add_commit(key(i), btard::mprng_commitment(step, 0, key(i), secret(i, 0))));
  round.close_commits();
  for (int i : {0, 1, 3})
    REQUIRE(round.add_reveal(key(i), secret(i, 0)));
  CHECK_FALSE(round.complete());
  auto out = round.finish();
  CHECK_FALSE(out.value);
  CHECK(out.withholders == std::vector<std::string>{key(2)});
  CHECK(out.silent.empty());
  CHECK(out.next_participants == std::vector<std::string>{key(0), key(1), key(3)});
  CHECK(out.next_attempt == 1);
  // The redraw: fresh r's, attempt 1 (an attempt-0 commitment does not carry over).
  auto again = round_of(step, out.next_attempt, out.next_participants);
  CHECK_FALSE(again.add_commit(key(2), secret(2, 1))); // the withholder is out
  for (int i : {0, 1, 3})
    REQUIRE(again.add_commit(key(i), btard::mprng_commitment(step, 1, key(i), secret(i, 1))));
  auto stale = again.add_reveal(key(0), secret(0, 0));
  CHECK_FALSE(stale);
  for (int i : {1, 3})
    REQUIRE(again.add_reveal(key(i), secret(i, 1)));
  auto late = again.finish();
  CHECK(late.withholders == std::vector<std::string>{key(0)}); // revealed the old r: caught
}

TEST_CASE("a copied commitment gains nothing: it does not open under the copier's key") {
  const uint64_t step = 8;
  auto round = round_of(step, 0, keys(3));
  auto honest = btard::mprng_commitment(step, 0, key(0), secret(0, 0));
  REQUIRE(round.add_commit(key(0), honest));
  REQUIRE(round.add_commit(key(1), honest)); // key 1 copies key 0's commitment
  REQUIRE(round.add_commit(key(2), btard::mprng_commitment(step, 0, key(2), secret(2, 0))));
  REQUIRE(round.add_reveal(key(0), secret(0, 0)));
  // The copier sees key 0's r and reveals it: it does not open, the copier is a withholder.
  auto copied = round.add_reveal(key(1), secret(0, 0));
  CHECK_FALSE(copied);
  CHECK(copied.what().find("does not open") != std::string::npos);
  // And stays one, whatever it reveals next.
  CHECK_FALSE(round.add_reveal(key(1), secret(1, 0)));
  REQUIRE(round.add_reveal(key(2), secret(2, 0)));
  auto out = round.finish();
  CHECK_FALSE(out.value);
  CHECK(out.withholders == std::vector<std::string>{key(1)});
}

TEST_CASE("a commitment is bound to its step, attempt and key") {
  auto r = secret(1, 0);
  auto c = btard::mprng_commitment(5, 0, key(1), r);
  CHECK(btard::mprng_commitment(6, 0, key(1), r) != c);
  CHECK(btard::mprng_commitment(5, 1, key(1), r) != c);
  CHECK(btard::mprng_commitment(5, 0, key(2), r) != c);
  CHECK(btard::mprng_commitment(5, 0, key(1), secret(2, 0)) != c);
}

TEST_CASE("an early reveal does not close the commitments on the slower participants") {
  const uint64_t step = 4;
  auto round = round_of(step, 0, keys(3));
  REQUIRE(round.add_commit(key(0), btard::mprng_commitment(step, 0, key(0), secret(0, 0))));
  REQUIRE(round.add_reveal(key(0), secret(0, 0)));
  CHECK(round.phase() == btard::mprng_phase::commits);
  for (int i : {1, 2})
    REQUIRE(round.add_commit(key(i), btard::mprng_commitment(step, 0, key(i), secret(i, 0))));
  for (int i : {1, 2})
    REQUIRE(round.add_reveal(key(i), secret(i, 0)));
  CHECK(round.complete());
  auto out = round.finish();
  CHECK(out.silent.empty());
  CHECK(out.value);
}

TEST_CASE("silent participants are left out of the value, not banned") {
  const uint64_t step = 1;
  auto round = round_of(step, 0, keys(4));
  for (int i : {0, 2})
    REQUIRE(round.add_commit(key(i), btard::mprng_commitment(step, 0, key(i), secret(i, 0))));
  round.close_commits();
  auto after = round.add_commit(key(1), btard::mprng_commitment(step, 0, key(1), secret(1, 0)));
  CHECK_FALSE(after);
  CHECK(after.what().find("closed") != std::string::npos);
  for (int i : {0, 2})
    REQUIRE(round.add_reveal(key(i), secret(i, 0)));
  CHECK_FALSE(round.complete()); // not everyone committed: finish waits for the deadline
  auto out = round.finish();
  CHECK(out.silent == std::vector<std::string>{key(1), key(3)});
  CHECK(out.withholders.empty());
  std::map<std::string, btard::digest> reveals{{key(0), secret(0, 0)}, {key(2), secret(2, 0)}};
  CHECK(value_of(out) == btard::mprng_value(step, 0, reveals));
  CHECK_FALSE(round.add_reveal(key(0), secret(0, 0))); // finished
}

TEST_CASE("the round refuses strangers, second commitments, early reveals and bad starts") {
  auto round = round_of(2, 0, keys(3));
  CHECK_FALSE(round.add_commit(key(7), secret(7, 0)));
  REQUIRE(round.add_commit(key(0), secret(0, 9)));
  CHECK(round.add_commit(key(0), secret(0, 9))); // the same again is fine
  auto second = round.add_commit(key(0), secret(0, 8));
  CHECK_FALSE(second);
  CHECK(second.what().find("second") != std::string::npos);
  auto early = round.add_reveal(key(1), secret(1, 0));
  CHECK_FALSE(early);
  CHECK(early.what().find("without a commitment") != std::string::npos);
  CHECK_FALSE(btard::mprng_round::start(0, 0, {}));
  CHECK_FALSE(btard::mprng_round::start(0, 0, {key(0), key(0)}));
  CHECK_FALSE(btard::mprng_round::start(0, 0, {"short"}));
  auto nobody = round_of(2, 0, keys(2)).finish();
  CHECK_FALSE(nobody.value);
  CHECK(nobody.withholders.empty());
  CHECK(nobody.silent.size() == 2);
}

TEST_CASE("direction and batch seeds are pure functions of r_t and the part or key") {
  auto r = btard::hash_bytes("r_t");
  auto r2 = btard::hash_bytes("r_t'");
  std::set<uint64_t> seen;
  for (uint64_t p = 0; p < 64; ++p) {
    CHECK(btard::direction_seed(r, p) == btard::direction_seed(r, p));
    seen.insert(btard::direction_seed(r, p));
    seen.insert(btard::direction_seed(r2, p));
  }
  for (int i = 0; i < 16; ++i) {
    CHECK(btard::batch_seed(r, key(i)) == btard::batch_seed(r, key(i)));
    seen.insert(btard::batch_seed(r, key(i)));
    seen.insert(btard::batch_seed(r2, key(i)));
  }
  CHECK(seen.size() == 2 * 64 + 2 * 16);
}

TEST_CASE("validators: distinct, never their own target, never banned, independent of order") {
  auto ps = keys(10);
  std::set<std::string> banned{key(2), key(7)};
  for (uint64_t t = 0; t < 300; ++t) {
    auto r = btard::hash_bytes("step" + std::to_string(t));
    for (bool exclude : {true, false}) {
      btard::validator_options opt{3, exclude};
      auto v = btard::draw_validators(r, ps, banned, opt);
      REQUIRE(v);
      REQUIRE(v->size() == 3);
      std::set<std::string> validators;
      for (const auto& x : *v) {
        CHECK(x.validator != x.target);
        CHECK(banned.count(x.validator) == 0);
        CHECK(banned.count(x.target) == 0);
        validators.insert(x.validator);
      }
      CHECK(validators.size() == 3);
      if (exclude)
        for (const auto& x : *v)
          CHECK(validators.count(x.target) == 0);
      auto shuffled = ps;
      std::reverse(shuffled.begin(), shuffled.end());
      auto w = btard::draw_validators(r, shuffled, banned, opt);
      REQUIRE(w);
      for (size_t i = 0; i < 3; ++i) {
        CHECK((*w)[i].validator == (*v)[i].validator);
        CHECK((*w)[i].target == (*v)[i].target);
      }
    }
  }
}

TEST_CASE("with m = 1 each (validator, target) pair has chance 1/(n(n-1))") {
  const int n = 6;
  auto ps = keys(n);
  const int draws = 30000;
  std::map<std::pair<std::string, std::string>, int> count;
  for (int t = 0; t < draws; ++t) {
    auto v = btard::draw_validators(btard::hash_bytes("d" + std::to_string(t)), ps, {},
                                    btard::validator_options{1, true});
    REQUIRE(v);
    REQUIRE(v->size() == 1);
    ++count[{(*v)[0].validator, (*v)[0].target}];
  }
  CHECK(count.size() == n * (n - 1));
  // Chi-square with 29 degrees of freedom; 60 is beyond its 0.9995 quantile (about 58.3).
  double expect = static_cast<double>(draws) / (n * (n - 1));
  double chi2 = 0;
  for (const auto& [pair, c] : count)
    chi2 += (c - expect) * (c - expect) / expect;
  CHECK(chi2 < 60.0);
}

TEST_CASE("draw_validators refuses too few peers, bad keys and duplicates") {
  auto r = btard::hash_bytes("x");
  CHECK_FALSE(btard::draw_validators(r, {key(0)}, {}, {1, true}));
  CHECK_FALSE(btard::draw_validators(r, keys(3), {key(1), key(2)}, {1, true}));
  CHECK_FALSE(btard::draw_validators(r, keys(3), {}, {3, true}));
  CHECK(btard::draw_validators(r, keys(3), {}, {3, false}));
  CHECK_FALSE(btard::draw_validators(r, keys(3), {}, {4, false}));
  CHECK_FALSE(btard::draw_validators(r, {key(0), key(0), key(1)}, {}, {1, true}));
  CHECK_FALSE(btard::draw_validators(r, {key(0), "short"}, {}, {1, true}));
  auto none = btard::draw_validators(r, keys(3), {}, {0, true});
  REQUIRE(none);
  CHECK(none->empty());
}

} // namespace starling::test::btard_mprng
