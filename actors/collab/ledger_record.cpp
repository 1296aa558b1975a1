#include "actors/collab/ledger_record.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "kernels/seeded_hash.hpp"
#include "kernels/stable_hash.hpp"

namespace starling::actors::collab {

namespace {

constexpr uint8_t summary_version = 2;
constexpr uint8_t flag_left = 1;
constexpr uint8_t flag_loss = 2;
constexpr uint8_t flag_step = 4;
constexpr uint8_t known_summary_flags = flag_left | flag_loss | flag_step;
constexpr uint16_t no_stage = 0xffff;
/// Tag of the shard hash (any constant: it only has to be the same for every peer).
constexpr uint64_t shard_seed = 0x6c65646765720001ULL;

void ledger_put_u8(std::vector<char>& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}

void ledger_put_u16(std::vector<char>& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}

void ledger_put_f64(std::vector<char>& out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, 8);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void ledger_put_text(std::vector<char>& out, const std::string& s, size_t max) {
  auto n = std::min(s.size(), max);
  ledger_put_u8(out, static_cast<uint8_t>(n));
  out.insert(out.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
}

/// Reads the untrusted bytes front to back; every read checks what is left first.
class ledger_reader {
public:
  explicit ledger_reader(const std::vector<char>& b) : p_(b.data()), left_(b.size()) {}

  bool u8(uint8_t& v) {
    if (left_ < 1)
      return false;
    v = static_cast<uint8_t>(*p_);
    advance(1);
    return true;
  }

  bool u16(uint16_t& v) {
    if (left_ < 2)
      return false;
    v = static_cast<uint16_t>(static_cast<uint8_t>(p_[0]) | (static_cast<uint8_t>(p_[1]) << 8));
    advance(2);
    return true;
  }

  bool f64(double& v) {
    if (left_ < 8)
      return false;
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i)
      bits |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    std::memcpy(&v, &bits, 8);
    advance(8);
    return true;
  }

  bool text(std::string& s, size_t max) {
    uint8_t n = 0;
    if (!u8(n) || n == 0 || n > max || left_ < n)
      return false;
    s.assign(p_, n);
    advance(n);
    return true;
  }

  /// Exactly `n` bytes as text (the length was read already).
  bool text_of(std::string& s, size_t n) {
    if (left_ < n)
      return false;
    s.assign(p_, n);
    advance(n);
    return true;
  }

  size_t left() const { return left_; }

private:
  void advance(size_t n) {
    p_ += n;
    left_ -= n;
  }
  const char* p_;
  size_t left_;
};

bool ledger_token_id_ok(const std::string& t) {
  return t.size() <= max_ledger_token_id_bytes &&
         std::all_of(t.begin(), t.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool ledger_count_ok(double v) {
  return std::isfinite(v) && v >= 0 && v <= max_ledger_count;
}

result<contribution_summary> refuse_summary(const std::string& what) {
  return fail("ledger record: " + what);
}

} // namespace

contribution_summary::contribution_summary() : loss(std::nan("")) {
  // nop
}

std::vector<char> encode_summary(const contribution_summary& s) {
  std::vector<char> out;
  out.reserve(128 + s.credits.size() * 24);
  ledger_put_u8(out, summary_version);
  bool has_loss = std::isfinite(s.loss);
  bool has_step = std::isfinite(s.step) && s.step >= 0 && s.step <= max_ledger_count;
  ledger_put_u8(out, static_cast<uint8_t>((s.left ? flag_left : 0) | (has_loss ? flag_loss : 0) |
                                          (has_step ? flag_step : 0)));
  for (double v : {s.time, s.started, s.computed, s.dropped, s.rounds, s.rounds_averaged,
                   s.bytes_sent, s.bytes_received, s.credits_other})
    ledger_put_f64(out, v);
  ledger_put_text(out, s.id, max_ledger_id_bytes);
  ledger_put_text(out, s.name, max_ledger_name_bytes);
  auto n = std::min(s.credits.size(), max_ledger_credits);
  ledger_put_u16(out, static_cast<uint16_t>(n));
  for (size_t i = 0; i < n; ++i) {
    ledger_put_text(out, s.credits[i].peer, max_ledger_name_bytes);
    ledger_put_f64(out, s.credits[i].samples);
  }
  ledger_put_f64(out, has_loss ? s.loss : 0.0);
  ledger_put_f64(out, has_step ? s.step : 0.0);
  ledger_put_u16(out, s.stage >= 0 && s.stage <= max_ledger_stage ? static_cast<uint16_t>(s.stage)
                                                                  : no_stage);
  auto token_ok = ledger_token_id_ok(s.token_id);
  ledger_put_u8(out, token_ok ? static_cast<uint8_t>(s.token_id.size()) : 0);
  if (token_ok)
    out.insert(out.end(), s.token_id.begin(), s.token_id.end());
  return out;
}

result<contribution_summary> decode_summary(const std::vector<char>& bytes) {
  ledger_reader r{bytes};
  uint8_t version = 0, flags = 0;
  if (!r.u8(version) || !r.u8(flags))
    return refuse_summary("too short for its header (" + std::to_string(bytes.size()) + " bytes)");
  if (version != summary_version)
    return refuse_summary("version " + std::to_string(version) + ", expected " +
                          std::to_string(summary_version));
  if ((flags & ~known_summary_flags) != 0)
    return refuse_summary("flags " + std::to_string(flags) + " carry unknown bits");
  contribution_summary s;
  s.left = (flags & flag_left) != 0;
  double* fields[] = {&s.time,       &s.started,        &s.computed,
                      &s.dropped,    &s.rounds,         &s.rounds_averaged,
                      &s.bytes_sent, &s.bytes_received, &s.credits_other};
  for (auto* f : fields)
    if (!r.f64(*f))
      return refuse_summary("too short for its counts");
  if (!std::isfinite(s.time) || !std::isfinite(s.started))
    return refuse_summary("a time is not finite");
  for (size_t i = 2; i < sizeof(fields) / sizeof(fields[0]); ++i)
    if (!ledger_count_ok(*fields[i]))
      return refuse_summary("a count is negative, not finite or above 2^53");
  if (s.dropped > s.computed || s.rounds_averaged > s.rounds)
    return refuse_summary("claims more dropped samples or averaged rounds than it has in all");
  if (!r.text(s.id, max_ledger_id_bytes))
    return refuse_summary("record id is empty, cut or longer than " +
                          std::to_string(max_ledger_id_bytes) + " bytes");
  if (!r.text(s.name, max_ledger_name_bytes))
    return refuse_summary("name is empty, cut or longer than " +
                          std::to_string(max_ledger_name_bytes) + " bytes");
  uint16_t n = 0;
  if (!r.u16(n))
    return refuse_summary("too short for its credit count");
  if (n > max_ledger_credits)
    return refuse_summary("carries " + std::to_string(n) + " credits, at most " +
                          std::to_string(max_ledger_credits) + " allowed");
  s.credits.reserve(n);
  for (uint16_t i = 0; i < n; ++i) {
    ledger_credit c;
    if (!r.text(c.peer, max_ledger_name_bytes) || !r.f64(c.samples))
      return refuse_summary("credit " + std::to_string(i) +
                            " is cut or its name empty or too long");
    if (!ledger_count_ok(c.samples))
      return refuse_summary("credit " + std::to_string(i) +
                            " is negative, not finite or above 2^53");
    s.credits.push_back(std::move(c));
  }
  double loss = 0, step = 0;
  uint16_t stage = 0;
  if (!r.f64(loss) || !r.f64(step) || !r.u16(stage))
    return refuse_summary("too short for its loss, step and stage");
  // An absent value is written as +0.0: anything else would decode to the same summary from
  // other bytes.
  auto zero = [](double v) { return v == 0 && !std::signbit(v); };
  if ((flags & flag_loss) != 0 ? !std::isfinite(loss) : !zero(loss))
    return refuse_summary("its loss is not finite, or absent and not 0");
  if ((flags & flag_step) != 0 ? !ledger_count_ok(step) : !zero(step))
    return refuse_summary("its step is negative, not finite or above 2^53, or absent and not 0");
  if (stage != no_stage && stage > max_ledger_stage)
    return refuse_summary("stage " + std::to_string(stage) + " is above " +
                          std::to_string(max_ledger_stage));
  s.loss = (flags & flag_loss) != 0 ? loss : std::nan("");
  s.step = (flags & flag_step) != 0 ? step : -1;
  s.stage = stage == no_stage ? -1 : static_cast<int>(stage);
  uint8_t token_bytes = 0;
  if (!r.u8(token_bytes))
    return refuse_summary("too short for its token id");
  if (token_bytes > 0 && !r.text_of(s.token_id, token_bytes))
    return refuse_summary("its token id is cut");
  if (!ledger_token_id_ok(s.token_id))
    return refuse_summary("its token id is not lower-case hex of at most " +
                          std::to_string(max_ledger_token_id_bytes) + " digits");
  if (r.left() != 0)
    return refuse_summary(std::to_string(r.left()) + " trailing bytes");
  return s;
}

result<contribution_summary> decode_summary_record(const std::string& subkey,
                                                   const std::vector<char>& bytes) {
  auto s = decode_summary(bytes);
  if (!s)
    return s;
  if (s->id != subkey)
    return refuse_summary("its id is not the sub-key it was stored under");
  return s;
}

size_t ledger_shard(const std::string& id) {
  auto h = shard_seed;
  for (unsigned char c : id)
    h = kernels::splitmix64_mix(h ^ c);
  return static_cast<size_t>(h % ledger_shards);
}

std::string ledger_key(const std::string& experiment, size_t shard) {
  return experiment + "/ledger/" + std::to_string(shard);
}

namespace {

constexpr uint8_t gate_summary_version = 1;

result<gate_summary> refuse_gate(const std::string& what) {
  return fail("gate record: " + what);
}

bool gate_reason_ok(const std::string& r) {
  return !r.empty() && r.size() <= max_gate_reason_bytes &&
         std::all_of(r.begin(), r.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
         });
}

bool gate_peer_id_ok(const std::string& id) {
  return !id.empty() && ledger_token_id_ok(id);
}

} // namespace

std::string gate_ledger_key(const std::string& experiment) {
  return experiment + "/ledger/gates";
}

std::vector<char> encode_gate_summary(const gate_summary& s) {
  std::vector<char> out;
  out.reserve(64 + s.by_reason.size() * 24 + s.parties.size() * 48);
  ledger_put_u8(out, gate_summary_version);
  for (double v : {s.time, s.started, s.others})
    ledger_put_f64(out, v);
  ledger_put_text(out, s.id, max_ledger_id_bytes);
  std::vector<std::pair<std::string, double>> reasons;
  for (auto& [r, n] : s.by_reason)
    if (gate_reason_ok(r) && reasons.size() < max_gate_reasons)
      reasons.emplace_back(r, n);
  ledger_put_u8(out, static_cast<uint8_t>(reasons.size()));
  for (auto& [r, n] : reasons) {
    ledger_put_text(out, r, max_gate_reason_bytes);
    ledger_put_f64(out, n);
  }
  std::vector<const gate_party*> parties;
  for (auto& p : s.parties)
    if (gate_peer_id_ok(p.peer_id) && parties.size() < max_gate_parties)
      parties.push_back(&p);
  ledger_put_u16(out, static_cast<uint16_t>(parties.size()));
  for (auto* p : parties) {
    ledger_put_text(out, p->peer_id, max_ledger_token_id_bytes);
    ledger_put_f64(out, p->refusals);
    auto n = std::min(p->ban_reason.size(), max_gate_ban_reason_bytes);
    ledger_put_u8(out, static_cast<uint8_t>(n));
    out.insert(out.end(), p->ban_reason.begin(),
               p->ban_reason.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

result<gate_summary> decode_gate_summary(const std::vector<char>& bytes) {
  ledger_reader r{bytes};
  uint8_t version = 0;
  if (!r.u8(version))
    return refuse_gate("empty");
  if (version != gate_summary_version)
    return refuse_gate("version " + std::to_string(version) + ", expected " +
                       std::to_string(gate_summary_version));
  gate_summary s;
  if (!r.f64(s.time) || !r.f64(s.started) || !r.f64(s.others))
    return refuse_gate("too short for its times");
  if (!std::isfinite(s.time) || !std::isfinite(s.started))
    return refuse_gate("a time is not finite");
  if (!ledger_count_ok(s.others))
    return refuse_gate("a count is negative, not finite or above 2^53");
  if (!r.text(s.id, max_ledger_id_bytes))
    return refuse_gate("record id is empty, cut or longer than " +
                       std::to_string(max_ledger_id_bytes) + " bytes");
  uint8_t reasons = 0;
  if (!r.u8(reasons))
    return refuse_gate("too short for its reason count");
  if (reasons > max_gate_reasons)
    return refuse_gate("carries " + std::to_string(reasons) + " reasons, at most " +
                       std::to_string(max_gate_reasons) + " allowed");
  for (uint8_t i = 0; i < reasons; ++i) {
    std::string reason;
    double n = 0;
    if (!r.text(reason, max_gate_reason_bytes) || !r.f64(n))
      return refuse_gate("reason " + std::to_string(i) + " is cut");
    if (!gate_reason_ok(reason))
      return refuse_gate("reason " + std::to_string(i) + " is not [a-z0-9_]");
    if (!ledger_count_ok(n))
      return refuse_gate("a count is negative, not finite or above 2^53");
    // In ascending order, each once: one record has one encoding.
    if (!s.by_reason.empty() && reason <= s.by_reason.rbegin()->first)
      return refuse_gate("reason " + std::to_string(i) + " is listed twice or out of order");
    s.by_reason.emplace(std::move(reason), n);
  }
  uint16_t parties = 0;
  if (!r.u16(parties))
    return refuse_gate("too short for its party count");
  if (parties > max_gate_parties)
    return refuse_gate("carries " + std::to_string(parties) + " parties, at most " +
                       std::to_string(max_gate_parties) + " allowed");
  s.parties.reserve(parties);
  std::unordered_set<std::string> seen;
  for (uint16_t i = 0; i < parties; ++i) {
    gate_party p;
    uint8_t ban_bytes = 0;
    if (!r.text(p.peer_id, max_ledger_token_id_bytes) || !r.f64(p.refusals) || !r.u8(ban_bytes))
      return refuse_gate("party " + std::to_string(i) + " is cut");
    if (!gate_peer_id_ok(p.peer_id))
      return refuse_gate("party " + std::to_string(i) + "'s peer id is not lower-case hex");
    if (!ledger_count_ok(p.refusals))
      return refuse_gate("a count is negative, not finite or above 2^53");
    if (ban_bytes > 0 && !r.text_of(p.ban_reason, ban_bytes))
      return refuse_gate("party " + std::to_string(i) + "'s ban reason is cut");
    if (!seen.insert(p.peer_id).second)
      return refuse_gate("party " + std::to_string(i) + " is listed twice");
    s.parties.push_back(std::move(p));
  }
  if (r.left() != 0)
    return refuse_gate(std::to_string(r.left()) + " trailing bytes");
  return s;
}

result<gate_summary> decode_gate_record(const std::string& subkey,
                                        const std::vector<char>& bytes) {
  auto s = decode_gate_summary(bytes);
  if (!s)
    return s;
  if (s->id != subkey)
    return refuse_gate("its id is not the sub-key it was stored under");
  return s;
}

std::vector<double> round_credits(const std::vector<int64_t>& part_sizes,
                                  const std::vector<double>& received, uint32_t self) {
  auto n = part_sizes.size();
  std::vector<double> out(n, 0.0);
  if (self >= n)
    return out;
  auto size = [&](size_t m) {
    auto v = static_cast<double>(part_sizes[m]);
    return v > 0 ? v : 0.0;
  };
  double total = 0;
  for (size_t m = 0; m < n; ++m)
    total += size(m);
  for (size_t m = 0; m < n && m < received.size(); ++m) {
    if (m == self)
      continue;
    auto w = received[m];
    if (!std::isfinite(w) || w <= 0)
      continue;
    auto others = total - size(m);
    if (others > 0)
      out[m] = w * size(self) / others;
  }
  return out;
}

std::string peer_of_member(const std::string& address) {
  auto slash = address.rfind('/');
  auto name = slash == std::string::npos ? address : address.substr(slash + 1);
  auto dash = name.rfind("-avg");
  if (dash == std::string::npos || dash == 0 || dash + 4 == name.size())
    return name;
  for (auto i = dash + 4; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9')
      return name;
  return name.substr(0, dash);
}

uint64_t trainer_tag(const std::string& trainer) {
  return kernels::stable_hash(trainer) >> 40;
}

std::map<std::string, uint64_t> trainer_tags(const std::vector<std::string>& trainers) {
  constexpr uint64_t tag_count = uint64_t{1} << 24;
  std::vector<const std::string*> order;
  order.reserve(trainers.size());
  for (auto& name : trainers)
    order.push_back(&name);
  std::sort(order.begin(), order.end(), [](const std::string* a, const std::string* b) {
    return a->size() != b->size() ? a->size() < b->size() : *a < *b;
  });
  std::map<std::string, uint64_t> out;
  std::unordered_set<uint64_t> taken;
  for (auto* n : order) {
    auto& name = *n;
    if (out.count(name) > 0 || taken.size() >= tag_count)
      continue;
    auto tag = trainer_tag(name);
    // Each draw is free with probability (1 - taken/2^24): few draws even for many trainers.
    for (uint64_t k = 1; taken.count(tag) > 0; ++k)
      tag = trainer_tag(name + "#" + std::to_string(k));
    taken.insert(tag);
    out.emplace(name, tag);
  }
  return out;
}

std::string trainer_credit_name_of_tag(uint64_t tag) {
  static const char* digits = "0123456789abcdef";
  std::string out = "mb:";
  for (int shift = 20; shift >= 0; shift -= 4)
    out.push_back(digits[(tag >> shift) & 15]);
  return out;
}

std::string trainer_credit_name(uint64_t microbatch_id) {
  return trainer_credit_name_of_tag(microbatch_id >> 40);
}

std::string trainer_credit_name_of(const std::string& trainer) {
  return trainer_credit_name(trainer_tag(trainer) << 40);
}

void credit_book::add(const std::string& peer, double samples) {
  if (!std::isfinite(samples) || samples <= 0)
    return;
  if (auto i = named_.find(peer); i != named_.end())
    i->second += samples;
  else if (named_.size() < max_ledger_credits && !peer.empty() &&
           peer.size() <= max_ledger_name_bytes)
    named_.emplace(peer, samples);
  else
    other_ += samples;
}

std::vector<ledger_credit> credit_book::list() const {
  std::vector<ledger_credit> out;
  out.reserve(named_.size());
  for (auto& [peer, samples] : named_)
    out.push_back({peer, samples});
  return out;
}

} // namespace starling::actors::collab
