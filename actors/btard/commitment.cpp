#include "actors/btard/commitment.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "actors/auth/identity.hpp"
#include "actors/btard/bytes.hpp"

namespace starling::actors::btard {

namespace {

constexpr size_t key_bytes = 32;
constexpr size_t sig_bytes = 64;

bool known_kind(uint64_t k) {
  return k >= static_cast<uint64_t>(statement_kind::part_digest) &&
         k <= static_cast<uint64_t>(statement_kind::state_digest);
}

bool known_accusation(uint64_t k) {
  return k >= static_cast<uint64_t>(accusation_kind::wrong_gradient) &&
         k <= static_cast<uint64_t>(accusation_kind::wrong_projection);
}

status validate_payload(const statement& s) {
  auto name = kind_name(s.kind);
  switch (s.kind) {
  case statement_kind::part_digest:
  case statement_kind::result_digest:
  case statement_kind::mprng_commit:
  case statement_kind::mprng_reveal:
    if (s.payload.size() != digest_bytes)
      return fail(fmt::format("{} statement: payload is {} bytes, expected a {}-byte digest", name,
                              s.payload.size(), digest_bytes));
    return {};
  case statement_kind::state_digest:
    if (s.payload.size() != digest_bytes)
      return fail(fmt::format("{} statement: payload is {} bytes, expected a {}-byte digest", name,
                              s.payload.size(), digest_bytes));
    if (s.slot.size() != key_bytes)
      return fail(fmt::format("{} statement: the slot is {} bytes, expected the {}-byte key of "
                              "the peer it is offered to",
                              name, s.slot.size(), key_bytes));
    return {};
  case statement_kind::projection: {
    auto p = parse_projection_payload(s.payload);
    if (!p)
      return fail(fmt::format("{} statement: {}", name, p.error().what));
    return {};
  }
  case statement_kind::part_digests: {
    auto d = parse_digests_payload(s.payload);
    if (!d)
      return fail(fmt::format("{} statement: {}", name, d.error().what));
    return {};
  }
  case statement_kind::projections: {
    auto p = parse_projections_payload(s.payload);
    if (!p)
      return fail(fmt::format("{} statement: {}", name, p.error().what));
    return {};
  }
  case statement_kind::phase_done: {
    auto d = parse_phase_done_payload(s.payload);
    if (!d)
      return fail(fmt::format("{} statement: {}", name, d.error().what));
    return {};
  }
  case statement_kind::accusation: {
    auto a = parse_accusation(s.payload);
    if (!a)
      return fail(fmt::format("{} statement: {}", name, a.error().what));
    if (a->accused == s.signer)
      return fail("accusation statement: the signer accuses itself");
    if (s.slot != accusation_slot(*a))
      return fail("accusation statement: the slot is not the accusation's (accused, kind, "
                  "subject)");
    return {};
  }
  }
  return fail(fmt::format("statement: unknown kind {}", static_cast<unsigned>(s.kind)));
}

} // namespace

const char* kind_name(statement_kind k) {
  switch (k) {
  case statement_kind::part_digest:
    return "part_digest";
  case statement_kind::result_digest:
    return "result_digest";
  case statement_kind::mprng_commit:
    return "mprng_commit";
  case statement_kind::mprng_reveal:
    return "mprng_reveal";
  case statement_kind::projection:
    return "projection";
  case statement_kind::part_digests:
    return "part_digests";
  case statement_kind::projections:
    return "projections";
  case statement_kind::accusation:
    return "accusation";
  case statement_kind::phase_done:
    return "phase_done";
  case statement_kind::state_digest:
    return "state_digest";
  }
  return "unknown";
}

const char* accusation_kind_name(accusation_kind k) {
  switch (k) {
  case accusation_kind::wrong_gradient:
    return "wrong_gradient";
  case accusation_kind::wrong_aggregate:
    return "wrong_aggregate";
  case accusation_kind::equivocation:
    return "equivocation";
  case accusation_kind::missing_part:
    return "missing_part";
  case accusation_kind::wrong_projection:
    return "wrong_projection";
  }
  return "unknown";
}

bool operator==(const statement& a, const statement& b) {
  return a.kind == b.kind && a.run_id == b.run_id && a.step == b.step && a.signer == b.signer &&
         a.slot == b.slot && a.payload == b.payload;
}

bool operator!=(const statement& a, const statement& b) {
  return !(a == b);
}

status validate(const statement& s) {
  if (!known_kind(static_cast<uint64_t>(s.kind)))
    return fail(fmt::format("statement: unknown kind {}", static_cast<unsigned>(s.kind)));
  if (s.run_id.empty() || s.run_id.size() > max_run_id_bytes)
    return fail(fmt::format("statement: run id is {} bytes, expected 1 to {}", s.run_id.size(),
                            max_run_id_bytes));
  if (s.signer.size() != key_bytes)
    return fail(
        fmt::format("statement: signer key is {} bytes, expected {}", s.signer.size(), key_bytes));
  if (s.slot.size() > max_slot_bytes)
    return fail(fmt::format("statement: slot is {} bytes, at most {} allowed", s.slot.size(),
                            max_slot_bytes));
  if (s.payload.size() > max_payload_bytes)
    return fail(fmt::format("statement: payload is {} bytes, at most {} allowed", s.payload.size(),
                            max_payload_bytes));
  return validate_payload(s);
}

std::string signed_bytes(const statement& s) {
  std::string out{statement_tag};
  out.reserve(out.size() + 64 + s.run_id.size() + s.slot.size() + s.payload.size());
  detail::put_le(out, static_cast<uint64_t>(s.kind), 1);
  detail::put_le(out, s.run_id.size(), 1);
  out += s.run_id;
  detail::put_u64(out, s.step);
  out += s.signer;
  detail::put_le(out, s.slot.size(), 1);
  out += s.slot;
  detail::put_le(out, s.payload.size(), 2);
  out += s.payload;
  return out;
}

result<signed_statement> sign_statement(statement s, const auth::key_pair& key) {
  if (auto st = validate(s); !st)
    return fail(st.what());
  if (s.signer != key.public_key())
    return fail("sign_statement: the statement's signer is not the signing key");
  auto sig = key.sign(signed_bytes(s));
  return signed_statement{std::move(s), std::move(sig)};
}

bool verify(const signed_statement& s) {
  if (!validate(s.body))
    return false;
  return auth::verify_signature(s.body.signer, signed_bytes(s.body), s.signature);
}

std::string encode(const signed_statement& s) {
  return signed_bytes(s.body) + s.signature;
}

result<signed_statement> decode(std::string_view bytes) {
  if (bytes.size() > max_statement_bytes)
    return fail(fmt::format("statement: {} bytes, longer than the {} a statement can be",
                            bytes.size(), max_statement_bytes));
  if (bytes.substr(0, statement_tag.size()) != statement_tag)
    return fail(fmt::format("statement: does not start with '{}'", statement_tag));
  detail::reader in(bytes.substr(statement_tag.size()));
  signed_statement out;
  auto& s = out.body;
  uint64_t kind = 0;
  uint64_t len = 0;
  if (!in.le(kind, 1))
    return fail("statement: truncated before the kind");
  if (!known_kind(kind))
    return fail(fmt::format("statement: unknown kind {}", kind));
  s.kind = static_cast<statement_kind>(kind);
  if (!in.le(len, 1) || len == 0 || len > max_run_id_bytes)
    return fail(fmt::format("statement: run id length missing or not in 1..{}", max_run_id_bytes));
  if (!in.raw(s.run_id, len))
    return fail("statement: truncated in the run id");
  if (!in.le(s.step, 8))
    return fail("statement: truncated in the step");
  if (!in.raw(s.signer, key_bytes))
    return fail("statement: truncated in the signer key");
  if (!in.le(len, 1) || len > max_slot_bytes)
    return fail(fmt::format("statement: slot length missing or over {}", max_slot_bytes));
  if (!in.raw(s.slot, len))
    return fail("statement: truncated in the slot");
  if (!in.le(len, 2) || len > max_payload_bytes)
    return fail(fmt::format("statement: payload length missing or over {}", max_payload_bytes));
  if (!in.raw(s.payload, len))
    return fail("statement: truncated in the payload");
  if (in.left() != sig_bytes)
    return fail(fmt::format("statement: {} bytes after the payload, expected the {}-byte "
                            "signature",
                            in.left(), sig_bytes));
  in.raw(out.signature, sig_bytes);
  if (auto st = validate(s); !st)
    return fail(st.what());
  if (!auth::verify_signature(s.signer, bytes.substr(0, bytes.size() - sig_bytes), out.signature))
    return fail(fmt::format("{} statement: the signature does not verify under its signer key",
                            kind_name(s.kind)));
  return out;
}

digest statement_digest(const signed_statement& s) {
  return hash_bytes(encode(s));
}

std::string index_slot(uint32_t attempt, uint64_t index) {
  std::string out;
  detail::put_le(out, attempt, 4);
  detail::put_u64(out, index);
  return out;
}

result<std::pair<uint32_t, uint64_t>> parse_index_slot(std::string_view slot) {
  if (slot.size() != 12)
    return fail(fmt::format("an index slot is 12 bytes, got {}", slot.size()));
  detail::reader in(slot);
  uint64_t attempt = 0;
  uint64_t index = 0;
  in.le(attempt, 4);
  in.le(index, 8);
  return std::pair<uint32_t, uint64_t>{static_cast<uint32_t>(attempt), index};
}

std::string digest_payload(const digest& d) {
  return digest_string(d);
}

std::string projection_payload(double s, double n) {
  std::string out;
  detail::put_f64(out, s);
  detail::put_f64(out, n);
  return out;
}

result<std::pair<double, double>> parse_projection_payload(std::string_view payload) {
  if (payload.size() != 16)
    return fail(
        fmt::format("a projection payload is 16 bytes (s, n as fp64), got {}", payload.size()));
  detail::reader in(payload);
  double s = 0;
  double n = 0;
  in.f64(s);
  in.f64(n);
  if (!std::isfinite(s) || !std::isfinite(n) || n < 0)
    return fail(
        fmt::format("a projection needs finite s and finite n >= 0, got s = {}, n = {}", s, n));
  return std::pair<double, double>{s, n};
}

std::string phase_done_payload(const std::vector<digest>& accusations) {
  std::string out;
  for (auto& d : accusations)
    out.append(reinterpret_cast<const char*>(d.data()), d.size());
  return out;
}

result<std::vector<digest>> parse_phase_done_payload(std::string_view payload) {
  if (payload.size() % digest_bytes != 0)
    return fail(fmt::format("a phase_done payload is a multiple of {} bytes, got {}", digest_bytes,
                            payload.size()));
  std::vector<digest> out(payload.size() / digest_bytes);
  for (size_t i = 0; i < out.size(); ++i)
    std::memcpy(out[i].data(), payload.data() + i * digest_bytes, digest_bytes);
  return out;
}

std::string digests_payload(const std::vector<digest>& digests) {
  std::string out;
  out.reserve(digests.size() * digest_bytes);
  for (auto& d : digests)
    out.append(reinterpret_cast<const char*>(d.data()), d.size());
  return out;
}

result<std::vector<digest>> parse_digests_payload(std::string_view payload) {
  if (payload.empty() || payload.size() % digest_bytes != 0)
    return fail(fmt::format("a digests payload is a non-empty multiple of {} bytes, got {}",
                            digest_bytes, payload.size()));
  std::vector<digest> out(payload.size() / digest_bytes);
  for (size_t i = 0; i < out.size(); ++i)
    std::copy(payload.begin() + static_cast<std::ptrdiff_t>(i * digest_bytes),
              payload.begin() + static_cast<std::ptrdiff_t>((i + 1) * digest_bytes),
              out[i].begin());
  return out;
}

std::string projections_payload(const std::vector<std::pair<double, double>>& pairs) {
  std::string out;
  for (auto& [s, n] : pairs)
    out += projection_payload(s, n);
  return out;
}

result<std::vector<std::pair<double, double>>> parse_projections_payload(std::string_view payload) {
  if (payload.empty() || payload.size() % 16 != 0)
    return fail(fmt::format("a projections payload is a non-empty multiple of 16 bytes, got {}",
                            payload.size()));
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < payload.size(); i += 16) {
    auto p = parse_projection_payload(payload.substr(i, 16));
    if (!p)
      return fail(fmt::format("part {}: {}", i / 16, p.error().what));
    out.push_back(*p);
  }
  return out;
}

std::string accusation_payload(const accusation& a) {
  std::string out = a.accused;
  detail::put_le(out, static_cast<uint64_t>(a.kind), 1);
  detail::put_le(out, a.subject.size(), 1);
  out += a.subject;
  detail::put_le(out, a.evidence.size(), 1);
  for (const auto& d : a.evidence)
    out += digest_string(d);
  return out;
}

result<accusation> parse_accusation(std::string_view payload) {
  detail::reader in(payload);
  accusation a;
  uint64_t v = 0;
  if (!in.raw(a.accused, key_bytes))
    return fail("accusation: truncated in the accused key");
  if (!in.le(v, 1) || !known_accusation(v))
    return fail("accusation: missing or unknown accusation kind");
  a.kind = static_cast<accusation_kind>(v);
  if (!in.le(v, 1) || v > max_slot_bytes)
    return fail(fmt::format("accusation: subject length missing or over {}", max_slot_bytes));
  if (!in.raw(a.subject, v))
    return fail("accusation: truncated in the subject");
  if (!in.le(v, 1) || v > max_evidence)
    return fail(fmt::format("accusation: evidence count missing or over {}", max_evidence));
  a.evidence.resize(v);
  for (auto& d : a.evidence) {
    std::string raw;
    if (!in.raw(raw, digest_bytes))
      return fail("accusation: truncated in the evidence digests");
    d = *digest_of_string(raw);
  }
  if (in.left() != 0)
    return fail(fmt::format("accusation: {} bytes after the evidence", in.left()));
  return a;
}

std::string accusation_slot(const accusation& a) {
  std::string out = a.accused;
  detail::put_le(out, static_cast<uint64_t>(a.kind), 1);
  out += a.subject;
  return out;
}

result<std::string> check_equivocation(const equivocation_proof& p) {
  const auto& a = p.first.body;
  const auto& b = p.second.body;
  if (!verify(p.first) || !verify(p.second))
    return fail("equivocation proof: a statement is malformed or its signature does not verify");
  if (a.kind != b.kind || a.run_id != b.run_id || a.step != b.step || a.signer != b.signer ||
      a.slot != b.slot)
    return fail("equivocation proof: the statements are not about one slot of one signer");
  if (a.payload == b.payload)
    return fail("equivocation proof: the statements say the same thing");
  return a.signer;
}

result<ledger_add> ledger::add(const signed_statement& s) {
  if (s.body.run_id != run_id_)
    return fail(fmt::format("ledger: a statement of run '{}' in the ledger of run '{}'",
                            s.body.run_id, run_id_));
  if (auto st = validate(s.body); !st)
    return fail(st.what());
  if (!verify(s))
    return fail(fmt::format("ledger: the {} statement's signature does not verify",
                            kind_name(s.body.kind)));
  slot_key k{s.body.step, static_cast<uint8_t>(s.body.kind), s.body.signer, s.body.slot};
  auto [it, fresh] = kept_.emplace(k, s);
  if (fresh)
    return ledger_add{ledger_event::recorded, std::nullopt};
  if (it->second.body.payload == s.body.payload)
    return ledger_add{ledger_event::duplicate, std::nullopt};
  equivocation_proof proof{it->second, s};
  proofs_.emplace(s.body.signer, proof);
  return ledger_add{ledger_event::equivocation, std::move(proof)};
}

const signed_statement* ledger::find(statement_kind kind, uint64_t step, std::string_view signer,
                                     std::string_view slot) const {
  auto it = kept_.find(
      slot_key{step, static_cast<uint8_t>(kind), std::string(signer), std::string(slot)});
  return it == kept_.end() ? nullptr : &it->second;
}

std::vector<const signed_statement*> ledger::of(statement_kind kind, uint64_t step) const {
  std::vector<const signed_statement*> out;
  auto k = static_cast<uint8_t>(kind);
  for (auto it = kept_.lower_bound(slot_key{step, k, std::string{}, std::string{}});
       it != kept_.end() && std::get<0>(it->first) == step && std::get<1>(it->first) == k; ++it)
    out.push_back(&it->second);
  return out;
}

bool ledger::condemned(std::string_view signer) const {
  return proofs_.find(signer) != proofs_.end();
}

void ledger::forget_before(uint64_t step) {
  kept_.erase(kept_.begin(), kept_.lower_bound(slot_key{step, 0, std::string{}, std::string{}}));
}

} // namespace starling::actors::btard
