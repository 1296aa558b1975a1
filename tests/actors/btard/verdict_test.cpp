#include "actors/btard/verdict.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/auth/identity.hpp"

namespace starling::test::btard_verdict {

namespace btard = starling::actors::btard;
using starling::actors::auth::key_pair;

namespace {

const std::string run = "run-v";

btard::signed_statement signed_by(const key_pair& k, btard::statement_kind kind, uint64_t step,
                                  std::string slot, std::string payload) {
  btard::statement s{kind, run, step, k.public_key(), std::move(slot), std::move(payload)};
  auto out = btard::sign_statement(std::move(s), k);
  REQUIRE(out);
  return *out;
}

btard::signed_statement accuse(const key_pair& accuser, const key_pair& accused,
                               btard::accusation_kind kind,
                               std::vector<btard::digest> evidence = {}) {
  btard::accusation a;
  a.accused = accused.public_key();
  a.kind = kind;
  a.subject = btard::index_slot(0, 1);
  a.evidence = std::move(evidence);
  return signed_by(accuser, btard::statement_kind::accusation, 9, btard::accusation_slot(a),
                   btard::accusation_payload(a));
}

/// Two different signed part digests of `k` for one slot.
btard::equivocation_proof equivocation_of(const key_pair& k) {
  auto slot = btard::index_slot(0, 1);
  return {signed_by(k, btard::statement_kind::part_digest, 9, slot,
                    btard::digest_payload(btard::hash_bytes("a"))),
          signed_by(k, btard::statement_kind::part_digest, 9, slot,
                    btard::digest_payload(btard::hash_bytes("b")))};
}

std::vector<btard::digest> cite(const btard::equivocation_proof& p) {
  return {btard::statement_digest(p.first), btard::statement_digest(p.second)};
}

} // namespace

TEST_CASE("recomputed and disputed accusations: every kind and outcome by the table") {
  auto accuser = key_pair::from_test_seed(20);
  auto accused = key_pair::from_test_seed(21);
  using K = btard::accusation_kind;
  using R = btard::recheck;
  using A = btard::verdict_action;
  struct row {
    K kind;
    R outcome;
    std::optional<A> action; // none: an error
  };
  const row table[] = {
      {K::wrong_gradient, R::confirmed, A::ban_accused},
      {K::wrong_gradient, R::refuted, A::ban_accuser},
      {K::wrong_gradient, R::undecidable, std::nullopt},
      {K::wrong_aggregate, R::confirmed, A::ban_accused},
      {K::wrong_aggregate, R::refuted, A::ban_accuser},
      {K::wrong_aggregate, R::undecidable, std::nullopt},
      {K::wrong_projection, R::confirmed, A::ban_accused},
      {K::wrong_projection, R::refuted, A::ban_accuser},
      {K::wrong_projection, R::undecidable, std::nullopt},
      {K::missing_part, R::confirmed, A::remove_both},
      {K::missing_part, R::refuted, A::remove_both},
      {K::missing_part, R::undecidable, A::remove_both},
      {K::equivocation, R::confirmed, std::nullopt}, // decided from its proof, never here
      {K::equivocation, R::refuted, std::nullopt},
      {K::equivocation, R::undecidable, std::nullopt},
  };
  for (const auto& r : table) {
    CAPTURE(btard::accusation_kind_name(r.kind));
    CAPTURE(btard::recheck_name(r.outcome));
    auto v = btard::decide(accuse(accuser, accused, r.kind), r.outcome);
    if (!r.action) {
      CHECK_FALSE(v);
      continue;
    }
    REQUIRE(v);
    CHECK(v->action == *r.action);
    CHECK(v->accuser == accuser.public_key());
    CHECK(v->accused == accused.public_key());
    std::set<std::string> want;
    if (*r.action != A::ban_accuser)
      want.insert(accused.public_key());
    if (*r.action != A::ban_accused)
      want.insert(accuser.public_key());
    CHECK(std::set<std::string>(v->banned.begin(), v->banned.end()) == want);
    CHECK(v->banned.size() == want.size());
    CHECK_FALSE(v->rule.empty());
  }
}

TEST_CASE("decide refuses statements that are not validly signed accusations") {
  auto a = key_pair::from_test_seed(22);
  auto b = key_pair::from_test_seed(23);
  auto s = accuse(a, b, btard::accusation_kind::wrong_gradient);
  auto forged = s;
  forged.signature[0] = static_cast<char>(forged.signature[0] ^ 1);
  CHECK_FALSE(btard::decide(forged, btard::recheck::confirmed));
  auto not_accusation =
      signed_by(a, btard::statement_kind::result_digest, 9, btard::index_slot(0, 1),
                btard::digest_payload(btard::hash_bytes("x")));
  auto r = btard::decide(not_accusation, btard::recheck::confirmed);
  REQUIRE_FALSE(r);
  CHECK(r.error().what.find("not an accusation") != std::string::npos);
  CHECK_FALSE(btard::decide_equivocation(not_accusation, nullptr));
  CHECK_FALSE(btard::decide_equivocation(s, nullptr)); // not an equivocation accusation
}

TEST_CASE("an equivocation proof condemns its signer alone; a bad one bans the accuser") {
  auto accuser = key_pair::from_test_seed(24);
  auto cheat = key_pair::from_test_seed(25);
  auto innocent = key_pair::from_test_seed(26);
  auto proof = equivocation_of(cheat);
  auto condemned = btard::condemned_by(proof);
  REQUIRE(condemned);
  CHECK(*condemned == cheat.public_key());

  struct row {
    const char* name;
    const key_pair* accused;
    std::optional<btard::equivocation_proof> proof;
    std::vector<btard::digest> evidence;
    btard::verdict_action action;
  };
  auto same = proof;
  same.second = same.first;
  auto forged = proof;
  forged.second.signature = forged.first.signature;
  const row table[] = {
      {"valid proof, cited", &cheat, proof, cite(proof), btard::verdict_action::ban_accused},
      {"proof missing", &cheat, std::nullopt, cite(proof), btard::verdict_action::ban_accuser},
      {"proof of another signer", &innocent, proof, cite(proof),
       btard::verdict_action::ban_accuser},
      {"proof not the one cited",
       &cheat,
       proof,
       {btard::hash_bytes("x")},
       btard::verdict_action::ban_accuser},
      {"same statement twice", &cheat, same, cite(same), btard::verdict_action::ban_accuser},
      {"forged signature", &cheat, forged, cite(forged), btard::verdict_action::ban_accuser},
  };
  for (const auto& r : table) {
    CAPTURE(r.name);
    auto s = accuse(accuser, *r.accused, btard::accusation_kind::equivocation, r.evidence);
    auto v = btard::decide_equivocation(s, r.proof ? &*r.proof : nullptr);
    REQUIRE(v);
    CHECK(v->action == r.action);
    REQUIRE(v->banned.size() == 1);
    CHECK(v->banned[0] == (r.action == btard::verdict_action::ban_accused ? r.accused->public_key()
                                                                          : accuser.public_key()));
  }
  CHECK_FALSE(btard::condemned_by(same));
}

TEST_CASE(
    "decide_all: proofs and recomputations before disputes, so an attacker's dispute is moot") {
  auto honest = key_pair::from_test_seed(30);
  auto attacker = key_pair::from_test_seed(31);
  // The attacker disputes a delivery from the honest peer; the honest validator's accusation of
  // the attacker's gradient is confirmed. Whatever the input order, only the attacker is banned.
  for (int order = 0; order < 2; ++order) {
    std::vector<btard::accusation_case> cases{
        {accuse(attacker, honest, btard::accusation_kind::missing_part),
         btard::recheck::undecidable, std::nullopt},
        {accuse(honest, attacker, btard::accusation_kind::wrong_gradient),
         btard::recheck::confirmed, std::nullopt},
    };
    if (order == 1)
      std::swap(cases[0], cases[1]);
    std::set<std::string> banned;
    auto out = btard::decide_all(cases, banned);
    REQUIRE(out.size() == 2);
    CHECK(banned == std::set<std::string>{attacker.public_key()});
    REQUIRE(out[0].decision);
    CHECK(out[0].decision->action == btard::verdict_action::ban_accused);
    CHECK(out[0].newly_banned == std::vector<std::string>{attacker.public_key()});
    CHECK_FALSE(out[1].decision);
    CHECK(out[1].note.find("moot") != std::string::npos);
  }
}

TEST_CASE("decide_all: one attacker's disputes remove at most one honest peer") {
  auto attacker = key_pair::from_test_seed(40);
  std::vector<key_pair> honest;
  std::vector<btard::accusation_case> cases;
  for (uint64_t i = 0; i < 4; ++i) {
    honest.push_back(key_pair::from_test_seed(41 + i));
    cases.push_back({accuse(attacker, honest.back(), btard::accusation_kind::missing_part),
                     btard::recheck::undecidable, std::nullopt});
  }
  std::set<std::string> banned;
  auto out = btard::decide_all(cases, banned);
  REQUIRE(out.size() == 4);
  CHECK(banned.size() == 2);
  CHECK(banned.count(attacker.public_key()) == 1);
  int decided = 0;
  for (const auto& d : out)
    decided += d.decision ? 1 : 0;
  CHECK(decided == 1);
  // The same cases decided again by another peer ban the same keys (canonical order).
  std::set<std::string> again;
  std::vector<btard::accusation_case> reversed(cases.rbegin(), cases.rend());
  btard::decide_all(reversed, again);
  CHECK(again == banned);
}

TEST_CASE("decide_all: evidence stands whoever filed it; malformed cases are reported") {
  auto validator = key_pair::from_test_seed(50);
  auto cheat = key_pair::from_test_seed(51);
  auto liar = key_pair::from_test_seed(52);
  auto victim = key_pair::from_test_seed(53);
  auto proof = equivocation_of(cheat);
  auto forged = accuse(liar, victim, btard::accusation_kind::wrong_aggregate);
  forged.signature[5] = static_cast<char>(forged.signature[5] ^ 1);
  std::vector<btard::accusation_case> cases{
      // Filed by a peer banned before the step: a confirmed recomputation still bans the accused.
      {accuse(validator, cheat, btard::accusation_kind::wrong_gradient), btard::recheck::confirmed,
       std::nullopt},
      {accuse(validator, cheat, btard::accusation_kind::equivocation, cite(proof)),
       btard::recheck::confirmed, proof},
      {accuse(liar, victim, btard::accusation_kind::wrong_projection), btard::recheck::refuted,
       std::nullopt},
      {forged, btard::recheck::confirmed, std::nullopt},
      {accuse(liar, victim, btard::accusation_kind::wrong_gradient), btard::recheck::undecidable,
       std::nullopt},
  };
  std::set<std::string> banned{validator.public_key()};
  auto out = btard::decide_all(cases, banned);
  REQUIRE(out.size() == 5);
  CHECK(banned ==
        std::set<std::string>{validator.public_key(), cheat.public_key(), liar.public_key()});
  CHECK(banned.count(victim.public_key()) == 0);
  // First the proof (tier 0), then the recomputations.
  REQUIRE(out[0].decision);
  CHECK(out[0].decision->rule.find("equivocation") != std::string::npos);
  CHECK(out[0].newly_banned == std::vector<std::string>{cheat.public_key()});
  int malformed = 0;
  int already = 0;
  for (const auto& d : out) {
    if (!d.decision)
      ++malformed;
    else if (d.newly_banned.empty())
      ++already;
  }
  CHECK(malformed == 2); // the forged signature and the undecidable recomputation
  CHECK(already == 1);   // the second ban of the cheat
}

} // namespace starling::test::btard_verdict
