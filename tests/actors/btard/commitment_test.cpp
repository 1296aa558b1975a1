#include "actors/btard/commitment.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "actors/auth/identity.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::test::btard_commitment {

namespace btard = starling::actors::btard;
using starling::actors::auth::key_pair;

namespace {

const std::string run = "run-41";

btard::statement make(const key_pair& k, btard::statement_kind kind, uint64_t step,
                      std::string slot, std::string payload) {
  return {kind, run, step, k.public_key(), std::move(slot), std::move(payload)};
}

btard::signed_statement signed_by(const key_pair& k, btard::statement s) {
  auto out = btard::sign_statement(std::move(s), k);
  REQUIRE(out);
  return *out;
}

btard::digest digest_of(uint64_t x) {
  return btard::hash_bytes(std::to_string(x));
}

btard::accusation an_accusation(const key_pair& accused) {
  btard::accusation a;
  a.accused = accused.public_key();
  a.kind = btard::accusation_kind::wrong_gradient;
  a.subject = btard::index_slot(0, 3);
  a.evidence = {digest_of(1), digest_of(2)};
  return a;
}

/// One valid statement of every kind, signed by `k` (accusations against `other`).
std::vector<btard::signed_statement> one_of_each(const key_pair& k, const key_pair& other) {
  auto slot = btard::index_slot(1, 2);
  auto d = btard::digest_payload(digest_of(7));
  auto a = an_accusation(other);
  return {
      signed_by(k, make(k, btard::statement_kind::part_digest, 4, slot, d)),
      signed_by(k, make(k, btard::statement_kind::result_digest, 4, slot, d)),
      signed_by(k, make(k, btard::statement_kind::mprng_commit, 4, slot, d)),
      signed_by(k, make(k, btard::statement_kind::mprng_reveal, 4, slot, d)),
      signed_by(k, make(k, btard::statement_kind::projection, 4, slot,
                        btard::projection_payload(-1.5, 2.25))),
      signed_by(k, make(k, btard::statement_kind::accusation, 4, btard::accusation_slot(a),
                        btard::accusation_payload(a))),
  };
}

} // namespace

TEST_CASE("every kind of statement signs, encodes and decodes to itself") {
  auto k = key_pair::from_test_seed(1);
  auto other = key_pair::from_test_seed(2);
  for (const auto& s : one_of_each(k, other)) {
    CAPTURE(btard::kind_name(s.body.kind));
    CHECK(btard::verify(s));
    auto wire = btard::encode(s);
    CHECK(wire.size() <= btard::max_statement_bytes);
    auto back = btard::decode(wire);
    REQUIRE(back);
    CHECK(back->body == s.body);
    CHECK(back->signature == s.signature);
    CHECK(btard::statement_digest(*back) == btard::statement_digest(s));
  }
}

TEST_CASE("decode refuses every truncation, every flipped byte and a trailing byte") {
  auto k = key_pair::from_test_seed(3);
  auto other = key_pair::from_test_seed(4);
  for (const auto& s : one_of_each(k, other)) {
    auto wire = btard::encode(s);
    CAPTURE(btard::kind_name(s.body.kind));
    for (size_t len = 0; len < wire.size(); ++len)
      CHECK_FALSE(btard::decode(wire.substr(0, len)));
    CHECK_FALSE(btard::decode(wire + '\0'));
    for (size_t i = 0; i < wire.size(); ++i) {
      auto bad = wire;
      bad[i] = static_cast<char>(bad[i] ^ 0x01);
      auto r = btard::decode(bad);
      CHECK_FALSE(r);
      if (!r)
        CHECK_FALSE(r.error().what.empty());
    }
  }
}

TEST_CASE("decode refuses random bytes and oversized input without reading past them") {
  kernels::splitmix64_stream rng{41};
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(static_cast<size_t>(rng.below(400)), '\0');
    for (auto& c : bytes)
      c = static_cast<char>(rng.next() & 0xff);
    if (i % 2 == 0) // Half of them with the right tag, to reach the field checks.
      bytes = std::string(btard::statement_tag) + bytes;
    CHECK_FALSE(btard::decode(bytes));
  }
  auto big = btard::decode(std::string(btard::max_statement_bytes + 1, 'x'));
  REQUIRE_FALSE(big);
  CHECK(big.error().what.find("longer than") != std::string::npos);
}

TEST_CASE("validate names the field that is wrong") {
  auto k = key_pair::from_test_seed(5);
  auto good = make(k, btard::statement_kind::part_digest, 1, btard::index_slot(0, 0),
                   btard::digest_payload(digest_of(1)));
  REQUIRE(btard::validate(good));
  struct bad_case {
    const char* name;
    void (*spoil)(btard::statement&);
    const char* says;
  };
  const bad_case cases[] = {
      {"empty run id", [](btard::statement& s) { s.run_id.clear(); }, "run id"},
      {"long run id", [](btard::statement& s) { s.run_id.assign(65, 'r'); }, "run id"},
      {"short signer", [](btard::statement& s) { s.signer.pop_back(); }, "signer"},
      {"long slot", [](btard::statement& s) { s.slot.assign(65, 's'); }, "slot"},
      {"short digest", [](btard::statement& s) { s.payload.pop_back(); }, "32-byte digest"},
      {"long payload", [](btard::statement& s) { s.payload.assign(1025, 'p'); }, "payload"},
      {"unknown kind", [](btard::statement& s) { s.kind = static_cast<btard::statement_kind>(11); },
       "unknown kind"},
      {"state offered to no key",
       [](btard::statement& s) { s.kind = btard::statement_kind::state_digest; },
       "expected the 32-byte key"},
      {"projection size",
       [](btard::statement& s) {
         s.kind = btard::statement_kind::projection;
         s.payload.assign(15, 'p');
       },
       "16 bytes"},
      {"projection nan",
       [](btard::statement& s) {
         s.kind = btard::statement_kind::projection;
         s.payload = btard::projection_payload(std::nan(""), 1.0);
       },
       "finite"},
      {"projection negative n",
       [](btard::statement& s) {
         s.kind = btard::statement_kind::projection;
         s.payload = btard::projection_payload(0.0, -1.0);
       },
       "n >= 0"},
      {"projection infinite n",
       [](btard::statement& s) {
         s.kind = btard::statement_kind::projection;
         s.payload = btard::projection_payload(0.0, std::numeric_limits<double>::infinity());
       },
       "finite"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto s = good;
    c.spoil(s);
    auto st = btard::validate(s);
    CHECK_FALSE(st);
    CHECK(st.what().find(c.says) != std::string::npos);
  }
}

TEST_CASE("accusations: payload round trip, bounded evidence, no self-accusation, canonical slot") {
  auto k = key_pair::from_test_seed(6);
  auto accused = key_pair::from_test_seed(7);
  auto a = an_accusation(accused);
  auto back = btard::parse_accusation(btard::accusation_payload(a));
  REQUIRE(back);
  CHECK(back->accused == a.accused);
  CHECK(back->kind == a.kind);
  CHECK(back->subject == a.subject);
  CHECK(back->evidence == a.evidence);

  auto many = a;
  many.evidence.assign(btard::max_evidence + 1, digest_of(3));
  auto too_many = btard::parse_accusation(btard::accusation_payload(many));
  REQUIRE_FALSE(too_many);
  CHECK(too_many.error().what.find("evidence count") != std::string::npos);
  auto trailing = btard::parse_accusation(btard::accusation_payload(a) + "x");
  REQUIRE_FALSE(trailing);
  CHECK(trailing.error().what.find("after the evidence") != std::string::npos);
  auto payload = btard::accusation_payload(a);
  payload[32] = 0; // kind 0 is none
  CHECK_FALSE(btard::parse_accusation(payload));

  auto self = an_accusation(k);
  auto st = btard::validate(make(k, btard::statement_kind::accusation, 1,
                                 btard::accusation_slot(self), btard::accusation_payload(self)));
  CHECK_FALSE(st);
  CHECK(st.what().find("accuses itself") != std::string::npos);

  auto wrong_slot = btard::validate(make(k, btard::statement_kind::accusation, 1,
                                         btard::index_slot(0, 3), btard::accusation_payload(a)));
  CHECK_FALSE(wrong_slot);
  CHECK(wrong_slot.what().find("slot") != std::string::npos);
}

TEST_CASE("a signature binds every field: the signer's key, the run, the step, the slot") {
  auto k = key_pair::from_test_seed(8);
  auto other = key_pair::from_test_seed(9);
  auto s = signed_by(k, make(k, btard::statement_kind::part_digest, 3, btard::index_slot(0, 1),
                             btard::digest_payload(digest_of(1))));
  auto moved = s;
  moved.body.run_id = "another-run";
  CHECK_FALSE(btard::verify(moved));
  moved = s;
  moved.body.step = 4;
  CHECK_FALSE(btard::verify(moved));
  moved = s;
  moved.body.slot = btard::index_slot(0, 2);
  CHECK_FALSE(btard::verify(moved));
  moved = s;
  moved.body.signer = other.public_key(); // a copied statement under another key
  CHECK_FALSE(btard::verify(moved));
  auto refused = btard::sign_statement(s.body, other);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().what.find("not the signing key") != std::string::npos);
}

TEST_CASE("index slots round-trip and other forms are refused") {
  auto slot = btard::index_slot(0xdeadbeef, 0x0123456789abcdefULL);
  CHECK(slot.size() == 12);
  auto back = btard::parse_index_slot(slot);
  REQUIRE(back);
  CHECK(back->first == 0xdeadbeefU);
  CHECK(back->second == 0x0123456789abcdefULL);
  CHECK_FALSE(btard::parse_index_slot(slot.substr(1)));
  CHECK(btard::index_slot(0, 1) != btard::index_slot(1, 0));
}

TEST_CASE("the ledger records, ignores duplicates, and turns a conflicting payload into proof") {
  auto a = key_pair::from_test_seed(10);
  auto b = key_pair::from_test_seed(11);
  btard::ledger book(run);
  auto slot = btard::index_slot(0, 2);
  auto first = signed_by(
      a, make(a, btard::statement_kind::part_digest, 5, slot, btard::digest_payload(digest_of(1))));
  auto same = signed_by(
      a, make(a, btard::statement_kind::part_digest, 5, slot, btard::digest_payload(digest_of(1))));
  auto other = signed_by(
      a, make(a, btard::statement_kind::part_digest, 5, slot, btard::digest_payload(digest_of(2))));
  auto r1 = book.add(first);
  REQUIRE(r1);
  CHECK(r1->event == btard::ledger_event::recorded);
  auto r2 = book.add(same);
  REQUIRE(r2);
  CHECK(r2->event == btard::ledger_event::duplicate);
  CHECK_FALSE(book.condemned(a.public_key()));
  auto r3 = book.add(other);
  REQUIRE(r3);
  CHECK(r3->event == btard::ledger_event::equivocation);
  REQUIRE(r3->proof);
  CHECK(r3->proof->first.body == first.body);
  CHECK(r3->proof->second.body == other.body);
  auto condemned = btard::check_equivocation(*r3->proof);
  REQUIRE(condemned);
  CHECK(*condemned == a.public_key());
  CHECK(book.condemned(a.public_key()));
  CHECK_FALSE(book.condemned(b.public_key()));
  // The first statement stays.
  auto kept = book.find(btard::statement_kind::part_digest, 5, a.public_key(), slot);
  REQUIRE(kept);
  CHECK(kept->body.payload == first.body.payload);

  // The same payload from another signer, another slot, kind or step is no conflict.
  for (auto s :
       {make(b, btard::statement_kind::part_digest, 5, slot, btard::digest_payload(digest_of(2))),
        make(a, btard::statement_kind::part_digest, 5, btard::index_slot(0, 3),
             btard::digest_payload(digest_of(2))),
        make(a, btard::statement_kind::result_digest, 5, slot, btard::digest_payload(digest_of(2))),
        make(a, btard::statement_kind::part_digest, 6, slot,
             btard::digest_payload(digest_of(2)))}) {
    auto r = book.add(signed_by(s.signer == a.public_key() ? a : b, s));
    REQUIRE(r);
    CHECK(r->event == btard::ledger_event::recorded);
  }
  CHECK(book.size() == 5);
  CHECK(book.of(btard::statement_kind::part_digest, 5).size() == 3);
  CHECK(book.proofs().size() == 1);
  book.forget_before(6);
  CHECK(book.size() == 1);
  CHECK(book.of(btard::statement_kind::part_digest, 6).size() == 1);
  CHECK(book.condemned(a.public_key())); // proofs outlive the statements
}

TEST_CASE("the ledger refuses forged signatures and other runs, recording nothing") {
  auto a = key_pair::from_test_seed(12);
  btard::ledger book(run);
  auto s = signed_by(a, make(a, btard::statement_kind::mprng_commit, 1, btard::index_slot(0, 0),
                             btard::digest_payload(digest_of(1))));
  auto forged = s;
  forged.body.payload = btard::digest_payload(digest_of(2));
  auto r = book.add(forged);
  REQUIRE_FALSE(r);
  CHECK(r.error().what.find("signature") != std::string::npos);
  auto elsewhere = s;
  elsewhere.body.run_id = "other";
  auto e = book.add(elsewhere);
  REQUIRE_FALSE(e);
  CHECK(e.error().what.find("run") != std::string::npos);
  CHECK(book.size() == 0);
  REQUIRE(book.add(s));
  // A forged conflicting statement is no proof: the signer is not condemned.
  CHECK_FALSE(book.add(forged));
  CHECK_FALSE(book.condemned(a.public_key()));
}

TEST_CASE("check_equivocation refuses pairs that prove nothing") {
  auto a = key_pair::from_test_seed(13);
  auto b = key_pair::from_test_seed(14);
  auto slot = btard::index_slot(0, 0);
  auto s1 = signed_by(a, make(a, btard::statement_kind::mprng_reveal, 2, slot,
                              btard::digest_payload(digest_of(1))));
  auto s2 = signed_by(a, make(a, btard::statement_kind::mprng_reveal, 2, slot,
                              btard::digest_payload(digest_of(2))));
  REQUIRE(btard::check_equivocation({s1, s2}));
  // Same payload.
  CHECK_FALSE(btard::check_equivocation({s1, s1}));
  // Two signers: nobody equivocated.
  auto t = signed_by(b, make(b, btard::statement_kind::mprng_reveal, 2, slot,
                             btard::digest_payload(digest_of(2))));
  CHECK_FALSE(btard::check_equivocation({s1, t}));
  // Different slots, steps or kinds.
  auto other_slot =
      signed_by(a, make(a, btard::statement_kind::mprng_reveal, 2, btard::index_slot(1, 0),
                        btard::digest_payload(digest_of(2))));
  CHECK_FALSE(btard::check_equivocation({s1, other_slot}));
  auto other_step = signed_by(a, make(a, btard::statement_kind::mprng_reveal, 3, slot,
                                      btard::digest_payload(digest_of(2))));
  CHECK_FALSE(btard::check_equivocation({s1, other_step}));
  // A forged second statement (signature of another payload).
  auto forged = s2;
  forged.signature = s1.signature;
  CHECK_FALSE(btard::check_equivocation({s1, forged}));
}

} // namespace starling::test::btard_commitment

namespace starling::test::btard_commitment_batched {

namespace btard = starling::actors::btard;

TEST_CASE("part_digests and projections statements carry every part in one signature") {
  auto k = starling::actors::auth::key_pair::from_test_seed(77);
  std::vector<btard::digest> ds{btard::hash_bytes("a"), btard::hash_bytes("b"),
                                btard::hash_bytes("c")};
  auto payload = btard::digests_payload(ds);
  CHECK(payload.size() == 3 * btard::digest_bytes);
  auto back = btard::parse_digests_payload(payload);
  REQUIRE(back);
  CHECK((*back == ds));
  CHECK_FALSE(btard::parse_digests_payload(""));
  CHECK_FALSE(btard::parse_digests_payload(payload.substr(1)));
  std::vector<std::pair<double, double>> pairs{{1.5, 2.0}, {-0.25, 0.0}};
  auto pp = btard::projections_payload(pairs);
  auto pb = btard::parse_projections_payload(pp);
  REQUIRE(pb);
  CHECK((*pb == pairs));
  CHECK_FALSE(btard::parse_projections_payload(pp.substr(0, 24)));
  CHECK_FALSE(btard::parse_projections_payload(btard::projections_payload({{1.0, -1.0}})));
  for (auto kind : {btard::statement_kind::part_digests, btard::statement_kind::projections}) {
    btard::statement st{kind, "run", 3, k.public_key(), btard::index_slot(0, 0),
                        kind == btard::statement_kind::part_digests ? payload : pp};
    auto sig = btard::sign_statement(st, k);
    REQUIRE(sig);
    auto wire = btard::encode(*sig);
    CHECK(wire.size() <= btard::max_statement_bytes);
    auto dec = btard::decode(wire);
    REQUIRE(dec);
    CHECK(btard::verify(*dec));
    st.payload = "xyz";
    CHECK_FALSE(btard::sign_statement(st, k));
  }
  // 256 parts' digests fit one statement; 257 do not.
  std::vector<btard::digest> many(256, btard::hash_bytes("x"));
  btard::statement big{btard::statement_kind::part_digests, "run", 3, k.public_key(),
                       btard::index_slot(0, 0), btard::digests_payload(many)};
  CHECK(btard::sign_statement(big, k));
  many.push_back(btard::hash_bytes("y"));
  big.payload = btard::digests_payload(many);
  CHECK_FALSE(btard::sign_statement(big, k));
}

} // namespace starling::test::btard_commitment_batched
