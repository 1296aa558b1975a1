#include "actors/btard/verdict.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

namespace starling::actors::btard {

namespace {

/// The accusation in a validly signed accusation statement.
result<accusation> accusation_of(const signed_statement& s) {
  if (s.body.kind != statement_kind::accusation)
    return fail(
        fmt::format("verdict: a {} statement is not an accusation", kind_name(s.body.kind)));
  if (!verify(s))
    return fail("verdict: the accusation is malformed or its signature does not verify");
  return parse_accusation(s.body.payload);
}

verdict make_verdict(verdict_action action, const std::string& accuser, const accusation& a,
                     std::string rule) {
  verdict v;
  v.action = action;
  v.accuser = accuser;
  v.accused = a.accused;
  if (action != verdict_action::ban_accuser)
    v.banned.push_back(a.accused);
  if (action != verdict_action::ban_accused)
    v.banned.push_back(accuser);
  std::sort(v.banned.begin(), v.banned.end());
  v.rule = std::move(rule);
  return v;
}

/// Decision order: proofs, then recomputed verdicts, then disputes.
int tier_of(const accusation_case& c) {
  auto a = parse_accusation(c.accusation.body.payload);
  if (a && a->kind == accusation_kind::equivocation)
    return 0;
  if (a && a->kind == accusation_kind::missing_part)
    return 2;
  return 1;
}

} // namespace

const char* recheck_name(recheck r) {
  switch (r) {
  case recheck::confirmed:
    return "confirmed";
  case recheck::refuted:
    return "refuted";
  case recheck::undecidable:
    return "undecidable";
  }
  return "unknown";
}

const char* verdict_action_name(verdict_action a) {
  switch (a) {
  case verdict_action::ban_accused:
    return "ban_accused";
  case verdict_action::ban_accuser:
    return "ban_accuser";
  case verdict_action::remove_both:
    return "remove_both";
  }
  return "unknown";
}

result<verdict> decide(const signed_statement& accusation_statement, recheck outcome) {
  auto a = accusation_of(accusation_statement);
  if (!a)
    return a.error();
  const auto& accuser = accusation_statement.body.signer;
  auto kind = accusation_kind_name(a->kind);
  switch (a->kind) {
  case accusation_kind::equivocation:
    return fail("verdict: an equivocation accusation is decided from its proof "
                "(decide_equivocation)");
  case accusation_kind::missing_part:
    return make_verdict(verdict_action::remove_both, accuser, *a,
                        fmt::format("missing_part ({}): a delivery nobody can prove; both "
                                    "leave",
                                    recheck_name(outcome)));
  case accusation_kind::wrong_gradient:
  case accusation_kind::wrong_aggregate:
  case accusation_kind::wrong_projection:
    if (outcome == recheck::confirmed)
      return make_verdict(verdict_action::ban_accused, accuser, *a,
                          fmt::format("{} confirmed by recomputation", kind));
    if (outcome == recheck::refuted)
      return make_verdict(verdict_action::ban_accuser, accuser, *a,
                          fmt::format("{} refuted by recomputation: a false accusation", kind));
    return fail(fmt::format("verdict: a {} accusation is decided by recomputation; '{}' is "
                            "not an outcome for it",
                            kind, recheck_name(outcome)));
  }
  return fail("verdict: unknown accusation kind");
}

result<verdict> decide_equivocation(const signed_statement& accusation_statement,
                                    const equivocation_proof* proof) {
  auto a = accusation_of(accusation_statement);
  if (!a)
    return a.error();
  if (a->kind != accusation_kind::equivocation)
    return fail(fmt::format("verdict: a {} accusation is not decided from an equivocation proof",
                            accusation_kind_name(a->kind)));
  const auto& accuser = accusation_statement.body.signer;
  if (proof == nullptr)
    return make_verdict(verdict_action::ban_accuser, accuser, *a,
                        "equivocation: the proof the evidence names could not be obtained");
  auto signer = check_equivocation(*proof);
  if (!signer)
    return make_verdict(verdict_action::ban_accuser, accuser, *a,
                        "equivocation: not a proof (" + signer.error().what + ")");
  if (*signer != a->accused)
    return make_verdict(verdict_action::ban_accuser, accuser, *a,
                        "equivocation: the proof condemns another signer than the accused");
  auto cited = [&](const signed_statement& s) {
    auto d = statement_digest(s);
    return std::find(a->evidence.begin(), a->evidence.end(), d) != a->evidence.end();
  };
  if (!cited(proof->first) || !cited(proof->second))
    return make_verdict(verdict_action::ban_accuser, accuser, *a,
                        "equivocation: the proof is not the one the evidence names");
  return make_verdict(verdict_action::ban_accused, accuser, *a,
                      "equivocation: two signed payloads for one slot condemn their signer");
}

result<std::string> condemned_by(const equivocation_proof& proof) {
  return check_equivocation(proof);
}

std::vector<decided_case> decide_all(std::vector<accusation_case> cases,
                                     std::set<std::string>& banned) {
  struct keyed {
    int tier;
    digest id;
    size_t index;
  };
  std::vector<keyed> order;
  for (size_t i = 0; i < cases.size(); ++i)
    order.push_back({tier_of(cases[i]), statement_digest(cases[i].accusation), i});
  std::sort(order.begin(), order.end(), [](const keyed& x, const keyed& y) {
    return std::tie(x.tier, x.id, x.index) < std::tie(y.tier, y.id, y.index);
  });
  std::vector<decided_case> out;
  for (const auto& k : order) {
    auto& c = cases[k.index];
    decided_case d;
    d.accusation_digest = k.id;
    auto a = accusation_of(c.accusation);
    if (!a) {
      d.note = a.error().what;
      out.push_back(std::move(d));
      continue;
    }
    const auto& accuser = c.accusation.body.signer;
    if (k.tier == 2 && (banned.count(accuser) != 0 || banned.count(a->accused) != 0)) {
      d.note = "moot: a party of the dispute is banned already";
      out.push_back(std::move(d));
      continue;
    }
    auto v = a->kind == accusation_kind::equivocation
                 ? decide_equivocation(c.accusation, c.proof ? &*c.proof : nullptr)
                 : decide(c.accusation, c.outcome);
    if (!v) {
      d.note = v.error().what;
      out.push_back(std::move(d));
      continue;
    }
    for (const auto& key : v->banned)
      if (banned.insert(key).second)
        d.newly_banned.push_back(key);
    if (d.newly_banned.empty())
      d.note = "banned already";
    d.decision = std::move(*v);
    out.push_back(std::move(d));
  }
  return out;
}

} // namespace starling::actors::btard
