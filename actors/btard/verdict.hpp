// BTARD verdicts: what every honest peer decides from a signed accusation and its own re-check
// of the evidence (ACCUSE, Algorithm 3 of Gorbunov et al. 2022). The rules:
//
//   accusation kind   | re-check: confirmed | refuted      | undecidable
//   wrong_gradient    | ban accused         | ban accuser  | (not an outcome: an error)
//   wrong_aggregate   | ban accused         | ban accuser  | (not an outcome: an error)
//   wrong_projection  | ban accused         | ban accuser  | (not an outcome: an error)
//   missing_part      | remove both         | remove both  | remove both
//   equivocation      | decided from the proof itself (`decide_equivocation`): a valid proof
//                     | against the accused bans the accused alone; anything else bans the
//                     | accuser (a false accusation)
//
// wrong_gradient, wrong_aggregate and wrong_projection are decided by recomputation from public
// values (the public batch seed, the parts checked against their digests, the direction z): the
// re-check either finds the accused's value wrong or the accusation false. A missing part is a
// delivery over a sealed, unsigned link: nobody can prove what was sent, so both leave (the
// paper's rule). Each Byzantine peer removes at most one honest peer that way, because it is
// banned with its first dispute. "Remove both" bans both keys, like any ban. A silent peer (no
// commitments at all: a crash) is not an accusation's matter; it is removed for the step by the
// MPRNG and silence rules.
//
// `decide_all` applies a step's verdicts in one canonical order, so every honest peer bans the
// same keys: equivocation proofs, then recomputed accusations, then disputes; within a tier by
// the accusation statement's digest. A dispute whose accuser or accused is already banned is
// moot and skipped (so a banned attacker's later disputes remove nobody); a proof or a
// recomputed verdict stands on its own evidence whoever filed it. No CAF.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/btard/commitment.hpp"
#include "kernels/result.hpp"

namespace starling::actors::btard {

/// What a peer's own re-check of an accusation's evidence found.
enum class recheck : uint8_t {
  /// The accused's value is wrong: the accusation holds.
  confirmed = 1,
  /// The accused's value is right: the accusation is false.
  refuted = 2,
  /// The evidence cannot say who lies (a delivery dispute).
  undecidable = 3,
};

/// The outcome's name.
const char* recheck_name(recheck r);

/// What a verdict does.
enum class verdict_action : uint8_t {
  /// Ban the accused.
  ban_accused = 1,
  /// Ban the accuser (a false accusation).
  ban_accuser = 2,
  /// Ban both (a dispute nobody can decide).
  remove_both = 3,
};

/// The action's name.
const char* verdict_action_name(verdict_action a);

/// A decided accusation.
struct verdict {
  /// What it does.
  verdict_action action = verdict_action::ban_accused;
  /// The accuser's key.
  std::string accuser;
  /// The accused's key.
  std::string accused;
  /// Keys to ban, sorted.
  std::vector<std::string> banned;
  /// The rule applied, in words, for the audit log.
  std::string rule;
};

/// Decides a recomputed or disputed accusation (not equivocation) by the table above. Fails when
/// `accusation` is not a validly signed accusation statement, for an equivocation accusation
/// (`decide_equivocation`), and for an outcome the kind does not allow.
result<verdict> decide(const signed_statement& accusation, recheck outcome);

/// Decides an equivocation accusation from the proof its evidence names (null: the re-checker
/// could not obtain it). A proof that checks, condemns the accused and whose two statement
/// digests are both among the accusation's evidence bans the accused; anything else bans the
/// accuser. Fails when `accusation` is not a validly signed equivocation accusation.
result<verdict> decide_equivocation(const signed_statement& accusation,
                                    const equivocation_proof* proof);

/// The ban an equivocation proof carries by itself, accusation or not (e.g. found by this peer's
/// own ledger): its signer alone. Fails when the proof does not check.
result<std::string> condemned_by(const equivocation_proof& proof);

/// One accusation of a step and what this peer's re-check found.
struct accusation_case {
  /// The signed accusation.
  signed_statement accusation;
  /// The re-check's outcome (ignored for equivocation).
  recheck outcome = recheck::refuted;
  /// For equivocation: the proof the evidence names, when obtained.
  std::optional<equivocation_proof> proof;
};

/// What `decide_all` did with one case.
struct decided_case {
  /// `statement_digest` of the accusation.
  digest accusation_digest{};
  /// The verdict (when the case was well-formed).
  std::optional<verdict> decision;
  /// Keys this verdict newly banned (empty when skipped, malformed, or already banned).
  std::vector<std::string> newly_banned;
  /// Why nothing was decided or banned, when so.
  std::string note;
};

/// Decides every case in the canonical order (see the header), adding the bans to `banned`
/// (the keys banned before the step, updated). Malformed cases are reported, not fatal.
std::vector<decided_case> decide_all(std::vector<accusation_case> cases,
                                     std::set<std::string>& banned);

} // namespace starling::actors::btard
