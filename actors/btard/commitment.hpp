// BTARD signed statements: what a peer says in public during a step (the digests of the parts
// it will send, the digest of the result it aggregated, its MPRNG commitment and reveal, its
// projections for the aggregate check, its accusations), signed with its Ed25519 key, and the
// ledger that keeps them and turns two different signed payloads for one slot into proof.
//
// A statement is (kind, run id, step, signer key, slot, payload). The slot names what the
// statement is about inside its step (a part, an MPRNG attempt, an accusation's subject); an
// honest signer signs at most one payload per (kind, step, slot). Two validly signed statements
// with the same (kind, run, step, signer, slot) and different payloads are an equivocation: the
// pair condemns its signer alone, whoever shows it (nobody else could have signed them).
//
// Encoding (the signed bytes; fixed-width fields little-endian):
//   "starling.btard.stmt.v1" | kind u8 | run id (u8 length, 1..64 bytes) | step u64 |
//   signer (32 bytes) | slot (u8 length, 0..64 bytes) | payload (u16 length, per kind, <= 1024)
// then, on the wire, the 64-byte Ed25519 signature of those bytes. `decode` takes untrusted
// bytes: it checks every length, the kind, the payload's form for the kind and the signature,
// and refuses anything else with a reason (it never reads past its input nor allocates more
// than the input's size).
//
// Payloads: part_digest, result_digest, mprng_commit, mprng_reveal: 32 bytes. projection: s and
// n as fp64 bit patterns (finite, n >= 0). accusation: `accusation` below, whose slot must be
// `accusation_slot` of it (so that one accuser says one thing per accused, kind and subject).
// No CAF; libsodium through actors/auth/identity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "actors/btard/digest.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {
class key_pair;
} // namespace starling::actors::auth

namespace starling::actors::btard {

/// What a statement says.
enum class statement_kind : uint8_t {
  /// The digest of the signer's contribution to one part (slot: `index_slot` of the part).
  part_digest = 1,
  /// The digest of the aggregate of the part the signer reduced (slot: `index_slot` of it).
  result_digest = 2,
  /// The signer's MPRNG commitment (slot: `index_slot(attempt, 0)`).
  mprng_commit = 3,
  /// The signer's MPRNG reveal (slot: `index_slot(attempt, 0)`).
  mprng_reveal = 4,
  /// The signer's (s, n) for one part of the aggregate check (slot: `index_slot` of the part).
  projection = 5,
  /// An accusation (slot: `accusation_slot` of the payload).
  accusation = 6,
  /// The digests of all the signer's parts in part order, one statement per aggregation (slot:
  /// `index_slot(attempt, 0)`): one signature instead of one per part, so a peer verifies O(n)
  /// signatures per step, not O(n²).
  part_digests = 7,
  /// The signer's (s, n) of every part in part order (slot: `index_slot(attempt, 0)`).
  projections = 8,
  /// The signer finished phase `index` of an aggregation (slot: `index_slot(attempt, phase)`)
  /// and filed the accusations whose `statement_digest`s the payload lists (none: empty). Peers
  /// in different processes (peer_core.hpp) wait for every member's marker before deciding, so
  /// they decide on the same accusations.
  phase_done = 9,
  /// The digest of the signer's state at the start of the statement's step (parameters,
  /// momentum, shared randomness, membership: `peer_core::export_state`), offered to a peer
  /// coming back into the running group (slot: that peer's 32-byte key). The rejoining peer
  /// takes the state that more members sign than any other (board_actor.hpp). Never part of a
  /// step's protocol: it is not offered to a peer's core.
  state_digest = 10,
};

/// The kind's name, for errors and logs.
const char* kind_name(statement_kind k);

/// What an accusation says the accused did.
enum class accusation_kind : uint8_t {
  /// Its contribution is not the gradient of its public batch (a validator recomputed it).
  wrong_gradient = 1,
  /// The aggregate it published for its part is not CenteredClip of the contributions.
  wrong_aggregate = 2,
  /// It signed two different payloads for one slot (evidence: the two statements' digests).
  equivocation = 3,
  /// It did not deliver a part it committed to (a delivery nobody can prove either way).
  missing_part = 4,
  /// Its published projection (s, n) does not match the part the accuser holds.
  wrong_projection = 5,
};

/// The accusation kind's name.
const char* accusation_kind_name(accusation_kind k);

/// Bytes of the signed statement tag that starts every encoding.
inline constexpr std::string_view statement_tag = "starling.btard.stmt.v1";
/// Longest run id.
inline constexpr size_t max_run_id_bytes = 64;
/// Longest slot.
inline constexpr size_t max_slot_bytes = 64;
/// Longest payload.
/// Room for the digests of 256 parts (a group of up to 256 peers) or the projections of 512.
inline constexpr size_t max_payload_bytes = 8192;
/// Most evidence digests in one accusation.
inline constexpr size_t max_evidence = 8;
/// Longest encoded signed statement.
inline constexpr size_t max_statement_bytes = statement_tag.size() + 1 + 1 + max_run_id_bytes + 8 +
                                              32 + 1 + max_slot_bytes + 2 + max_payload_bytes + 64;

/// An unsigned statement.
struct statement {
  /// What it says.
  statement_kind kind = statement_kind::part_digest;
  /// The run it belongs to (1..64 bytes): a statement of one run means nothing in another.
  std::string run_id;
  /// The training step.
  uint64_t step = 0;
  /// The signer's 32-byte Ed25519 public key.
  std::string signer;
  /// What inside the step it is about (0..64 bytes; see the kinds).
  std::string slot;
  /// What it says, in the kind's form.
  std::string payload;
};

/// True when every field is equal.
bool operator==(const statement& a, const statement& b);
bool operator!=(const statement& a, const statement& b);

/// A statement and its signer's Ed25519 signature of `signed_bytes(body)`.
struct signed_statement {
  /// The statement.
  statement body;
  /// 64 bytes.
  std::string signature;
};

/// Checks every field of `s` (sizes, kind, the payload's form for the kind, the accusation's
/// slot); the reason names the field.
status validate(const statement& s);

/// The canonical bytes of `s` that its signer signs (`s` must be valid).
std::string signed_bytes(const statement& s);

/// Signs `s` with `key`: fails when `s` is invalid or `s.signer` is not `key`'s public key.
result<signed_statement> sign_statement(statement s, const auth::key_pair& key);

/// True when `s` is valid and its signature verifies under `s.body.signer`.
bool verify(const signed_statement& s);

/// The wire bytes: `signed_bytes(body)` then the signature.
std::string encode(const signed_statement& s);

/// Decodes untrusted wire bytes: validates every field and the signature.
result<signed_statement> decode(std::string_view bytes);

/// The digest an accusation cites a statement by: BLAKE2b-256 of `encode(s)`.
digest statement_digest(const signed_statement& s);

/// The slot of item `index` (a part, or 0 for the MPRNG) of attempt `attempt` of a step: 12
/// bytes, attempt u32 then index u64. Attempts count the step's redraws and re-aggregations.
std::string index_slot(uint32_t attempt, uint64_t index);

/// (attempt, index) of an `index_slot`; fails on any other form.
result<std::pair<uint32_t, uint64_t>> parse_index_slot(std::string_view slot);

/// The payload of a digest statement.
std::string digest_payload(const digest& d);

/// The payload of a projection statement (s, n).
std::string projection_payload(double s, double n);

/// (s, n) of a projection payload; fails unless 16 bytes of finite values with n >= 0.
result<std::pair<double, double>> parse_projection_payload(std::string_view payload);

/// The payload of a `part_digests` statement: the digests back to back (at least one).
std::string digests_payload(const std::vector<digest>& digests);
/// Parses it; fails unless it is a non-empty whole number of digests.
result<std::vector<digest>> parse_digests_payload(std::string_view payload);

/// The payload of a `projections` statement: (s, n) per part, back to back (at least one).
std::string projections_payload(const std::vector<std::pair<double, double>>& pairs);
/// Parses it; fails unless it is a non-empty whole number of pairs, each finite with n >= 0.
result<std::vector<std::pair<double, double>>> parse_projections_payload(std::string_view payload);

/// An accusation's payload (the accuser is the statement's signer, the step its step).
struct accusation {
  /// The accused's 32-byte public key.
  std::string accused;
  /// What it is accused of.
  accusation_kind kind = accusation_kind::wrong_gradient;
  /// The accused statement's slot (e.g. `index_slot` of the part), 0..64 bytes.
  std::string subject;
  /// Digests of the evidence (statements by `statement_digest`, parts by `part_digest`), <= 8.
  std::vector<digest> evidence;
};

/// Encodes `a`: accused (32) | kind u8 | subject (u8 length) | evidence count u8 | digests.
std::string accusation_payload(const accusation& a);

/// Decodes an accusation payload (untrusted); fails on any malformed field or trailing byte.
result<accusation> parse_accusation(std::string_view payload);

/// The slot an accusation is signed under: accused | kind | subject.
std::string accusation_slot(const accusation& a);

/// The payload of a `phase_done` statement: the digests back to back (may be empty).
std::string phase_done_payload(const std::vector<digest>& accusations);
/// Parses it; fails unless it is a whole number of digests (at most `max_payload_bytes`).
result<std::vector<digest>> parse_phase_done_payload(std::string_view payload);

/// Two validly signed statements of one signer for one slot with different payloads.
struct equivocation_proof {
  /// The statement recorded first.
  signed_statement first;
  /// The conflicting one.
  signed_statement second;
};

/// The condemned signer's key when `p` is a proof (both signatures valid, same kind, run, step,
/// signer and slot, different payloads); else why it is not one.
result<std::string> check_equivocation(const equivocation_proof& p);

/// What `ledger::add` did.
enum class ledger_event : uint8_t {
  /// First statement for its slot: kept.
  recorded,
  /// Same payload as the one kept (perhaps another valid signature): nothing changed.
  duplicate,
  /// A different payload for a slot already held: `proof` condemns the signer.
  equivocation,
};

/// The outcome of `ledger::add`.
struct ledger_add {
  /// What happened.
  ledger_event event = ledger_event::recorded;
  /// Set for `equivocation`: the kept statement and the new one.
  std::optional<equivocation_proof> proof;
};

/// The statements of one run seen so far, one per (step, kind, signer, slot), and the signers
/// caught equivocating. Keyed by signer key, never by a peer's index.
class ledger {
public:
  /// A ledger for run `run_id`.
  explicit ledger(std::string run_id) : run_id_(std::move(run_id)) {}

  /// Records `s` (signature verified here). Fails, recording nothing, for an invalid statement,
  /// a bad signature or another run. A conflicting payload is not recorded: the first stays.
  result<ledger_add> add(const signed_statement& s);

  /// The statement kept for the slot, or null.
  const signed_statement* find(statement_kind kind, uint64_t step, std::string_view signer,
                               std::string_view slot) const;

  /// The statements of `kind` at `step`, by (signer, slot).
  std::vector<const signed_statement*> of(statement_kind kind, uint64_t step) const;

  /// The first proof against each signer caught equivocating, by signer key.
  const std::map<std::string, equivocation_proof, std::less<>>& proofs() const noexcept {
    return proofs_;
  }

  /// True when `signer` has been caught equivocating.
  bool condemned(std::string_view signer) const;

  /// Drops the statements of steps before `step` (proofs stay).
  void forget_before(uint64_t step);

  /// Statements kept.
  size_t size() const noexcept { return kept_.size(); }

private:
  using slot_key = std::tuple<uint64_t, uint8_t, std::string, std::string>;
  std::string run_id_;
  std::map<slot_key, signed_statement> kept_;
  std::map<std::string, equivocation_proof, std::less<>> proofs_;
};

} // namespace starling::actors::btard
