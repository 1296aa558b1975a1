#include "actors/btard/protocol.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/auth/identity.hpp"
#include "actors/btard/clip.hpp"
#include "actors/btard/step_util.hpp"

namespace starling::actors::btard {

namespace {

constexpr const char* rule_names[] = {"mean", "centered_clip", "btard"};

constexpr const char* protocol_attack_names[] = {"none",
                                                 "gross_aggregate",
                                                 "other_tau",
                                                 "leave_one_out",
                                                 "part_not_committed",
                                                 "equivocate_digest",
                                                 "different_results",
                                                 "false_accusation",
                                                 "withhold_reveal",
                                                 "missing_part",
                                                 "lie_projection",
                                                 "non_finite_part",
                                                 "non_finite_result"};

/// Adds the wall time since the last lap to `ms[name]`; the time after the last lap goes to
/// "other" when the clock goes out of scope (an attempt that ends early). Part digests are
/// timed on their own ("hash") and left out of the phase they happen in.
class phase_clock {
public:
  explicit phase_clock(std::map<std::string, double>& ms) : ms_(ms), last_(now()) {}
  ~phase_clock() { lap("other"); }
  phase_clock(const phase_clock&) = delete;
  phase_clock& operator=(const phase_clock&) = delete;
  void lap(const char* name) {
    auto t = now();
    ms_[name] += std::chrono::duration<double, std::milli>(t - last_).count() - hashed_;
    hashed_ = 0.0;
    last_ = t;
  }
  /// `part_digest` of `count` values, its time counted as "hash".
  digest hash(uint64_t step, uint64_t part, const float* values, size_t count) {
    auto t = now();
    auto d = part_digest(step, part, values, count);
    double ms = std::chrono::duration<double, std::milli>(now() - t).count();
    ms_["hash"] += ms;
    hashed_ += ms;
    return d;
  }

private:
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
  std::map<std::string, double>& ms_;
  std::chrono::steady_clock::time_point last_;
  double hashed_ = 0.0;
};

} // namespace

const char* rule_name(aggregation_rule r) {
  return rule_names[static_cast<size_t>(r)];
}

result<aggregation_rule> parse_rule(const std::string& name) {
  for (size_t i = 0; i < std::size(rule_names); ++i)
    if (name == rule_names[i])
      return static_cast<aggregation_rule>(i);
  return fail(fmt::format("unknown aggregation '{}' (known: mean, centered_clip, btard)", name));
}

const char* protocol_attack_name(protocol_attack a) {
  return protocol_attack_names[static_cast<size_t>(a)];
}

result<protocol_attack> parse_protocol_attack(const std::string& name) {
  for (size_t i = 0; i < std::size(protocol_attack_names); ++i)
    if (name == protocol_attack_names[i])
      return static_cast<protocol_attack>(i);
  std::string known;
  for (auto* n : protocol_attack_names)
    known += (known.empty() ? "" : ", ") + std::string(n);
  return fail(fmt::format("unknown protocol attack '{}' (known: {})", name, known));
}

std::vector<protocol_attack> protocol_attacks() {
  std::vector<protocol_attack> out;
  for (size_t i = 1; i < std::size(protocol_attack_names); ++i)
    out.push_back(static_cast<protocol_attack>(i));
  return out;
}

status validate(const group_options& o) {
  if (o.run_id.empty() || o.run_id.size() > max_run_id_bytes)
    return fail(fmt::format("run id must have 1 to {} bytes", max_run_id_bytes));
  if (!(o.tau > 0) || !std::isfinite(o.tau))
    return fail(fmt::format("tau must be positive, not {}", o.tau));
  if (!(o.tolerance > 0) || !std::isfinite(o.tolerance))
    return fail(fmt::format("tolerance must be positive, not {}", o.tolerance));
  if (o.max_iterations < 1)
    return fail("iterations must be at least 1");
  if (!(o.validation_rel_tolerance >= 0) || !std::isfinite(o.validation_rel_tolerance))
    return fail("validation tolerance must be >= 0");
  if (!(o.sigmas > 0))
    return fail("sigmas must be positive");
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    return fail(fmt::format("lr must be positive, not {}", o.lr));
  if (!(o.momentum >= 0 && o.momentum < 1))
    return fail(fmt::format("momentum must lie in [0, 1), not {}", o.momentum));
  if (o.max_attempts < 1)
    return fail("max_attempts must be at least 1");
  return validate(o.membership);
}

digest params_digest(const std::vector<float>& params) {
  return hash_bytes(std::string_view(reinterpret_cast<const char*>(params.data()),
                                     params.size() * sizeof(float)));
}

digest initial_randomness(const std::string& run_id, uint64_t seed) {
  return hash_bytes("starling.btard.r0.v1" + le64(run_id.size()) + run_id + le64(seed));
}

digest skipped_randomness(const digest& r_prev) {
  return hash_bytes("starling.btard.r-skip.v1" + std::string(r_prev.begin(), r_prev.end()));
}

// --- the group ---------------------------------------------------------------------------------

struct simulated_group::impl {
  struct peer {
    auth::key_pair key;
    std::string pk;
    size_t index = 0;
    peer_spec spec;
    std::vector<float> params, velocity;
    membership view;
    /// Offline at the last step: its state is stale until it downloads.
    bool stale = false;
    std::unique_ptr<delayed_gradients> delayed;

    peer(auth::key_pair k, size_t i, peer_spec s, membership_options mo)
        : key(std::move(k)), pk(key.public_key()), index(i), spec(std::move(s)), view(mo) {}
    bool honest() const { return !spec.byzantine(); }
  };

  group_options o;
  std::shared_ptr<const task> t;
  std::vector<std::unique_ptr<peer>> peers; // spec order
  std::map<std::string, peer*> by_key;      // key order
  uint64_t step = 0;
  digest r_prev{};
  std::unique_ptr<random_direction_attack> direction;
  /// The public board (the DHT as honest peers see it after re-storing what they read).
  ledger board;

  impl(const group_options& go, std::shared_ptr<const task> task)
      : o(go), t(std::move(task)), board(go.run_id) {}

  peer* first_honest() const {
    for (auto& [k, p] : by_key)
      if (p->honest())
        return p;
    return nullptr;
  }
  /// The first honest peer online and current at this step (the donor and the reference view).
  peer* reference() const {
    for (auto& [k, p] : by_key)
      if (p->honest() && !p->spec.offline_at(step) && !p->stale)
        return p;
    return first_honest();
  }

  // -- per-step state ---------------------------------------------------------------------------
  /// A gradient held once and shared by every map that names it (an honest member's true,
  /// sent and recomputed gradient are one vector).
  using shared_vector = std::shared_ptr<const std::vector<float>>;
  /// A run of values a member applies: `size` values at `begin` of the model, read from
  /// `values` (a part's result as the member received it, or the whole plain aggregate).
  struct piece {
    size_t begin = 0;
    const float* values = nullptr;
    size_t size = 0;
  };
  struct step_state {
    uint64_t step = 0;
    std::map<std::string, uint64_t> seeds;
    /// What each member sends (its attacked gradient) and its true gradient.
    std::map<std::string, shared_vector> sent, truth;
    /// Recomputed true gradients (validators and re-checks), by key.
    std::map<std::string, shared_vector> recomputed;
    /// Storage the applied pieces point into (results, copies that differ from them).
    std::deque<std::vector<float>> kept;
    /// θ_t every honest member holds.
    std::vector<float> theta;
    /// The honest statistics IPM and ALIE attackers share (computed once per step), and the
    /// count of gradient attackers among the members.
    std::optional<honest_statistics> honest_stats;
    size_t gradient_attackers = 0;
  };

  result<shared_vector> true_gradient(step_state& s, const std::string& key) {
    auto it = s.recomputed.find(key);
    if (it != s.recomputed.end())
      return it->second;
    auto g = t->gradient(s.theta, s.seeds.at(key), false);
    if (!g)
      return fail(g.error().what);
    auto shared = std::make_shared<const std::vector<float>>(std::move(*g));
    s.recomputed.emplace(key, shared);
    return shared;
  }

  result<signed_statement> publish(attempt_record& rec, const peer& p, statement_kind kind,
                                   std::string slot, std::string payload) {
    statement st{kind, o.run_id, step, p.pk, std::move(slot), std::move(payload)};
    auto s = sign_statement(std::move(st), p.key);
    if (!s)
      return s;
    auto added = board.add(*s);
    if (!added)
      return fail(added.error().what);
    rec.statements.push_back(*s);
    rec.bytes_statements += encode(*s).size();
    return s;
  }

  /// Publishes an accusation and files it in `cases` with the re-check's outcome (a pure
  /// function of public values: computed once, the same for every honest peer).
  status accuse(attempt_record& rec, std::vector<accusation_case>& cases, const peer& accuser,
                const std::string& accused, accusation_kind kind, std::string subject,
                std::vector<digest> evidence, recheck outcome) {
    accusation a;
    a.accused = accused;
    a.kind = kind;
    a.subject = std::move(subject);
    if (evidence.size() > max_evidence)
      evidence.resize(max_evidence);
    a.evidence = std::move(evidence);
    auto st = publish(rec, accuser, statement_kind::accusation, accusation_slot(a),
                      accusation_payload(a));
    if (!st)
      return fail(st.error().what);
    cases.push_back({*st, outcome, std::nullopt});
    return {};
  }

  /// Decides the filed cases (every honest view on its own) and removes the banned from the
  /// step. Returns whether anyone was banned.
  bool settle(attempt_record& rec, std::vector<accusation_case>& cases,
              std::set<std::string>& removed) {
    rec.banned = decide(rec, std::move(cases), {});
    cases.clear();
    removed.insert(rec.banned.begin(), rec.banned.end());
    return !rec.banned.empty();
  }

  /// Every honest view applies the decided cases; returns the keys the first honest view banned.
  std::vector<std::string> decide(attempt_record& rec, std::vector<accusation_case> cases,
                                  const std::vector<std::string>& condemned) {
    std::vector<std::string> newly;
    bool first = true;
    for (auto& [k, p] : by_key) {
      if (p->spec.byzantine())
        continue; // attackers follow the bans through the honest majority's gates
      std::set<std::string> banned;
      for (auto& [b, why] : p->view.banned())
        banned.insert(b);
      auto before = banned;
      for (auto& c : condemned)
        banned.insert(c);
      auto decided = decide_all(cases, banned);
      for (auto& c : condemned)
        if (!before.count(c))
          p->view.ban(c, "equivocation proof");
      for (auto& d : decided)
        for (auto& b : d.newly_banned)
          p->view.ban(b, d.decision ? d.decision->rule : "verdict");
      if (first) {
        for (auto& c : condemned)
          if (!before.count(c))
            newly.push_back(c);
        for (size_t i = 0; i < decided.size(); ++i) {
          auto& d = decided[i];
          if (!d.decision)
            continue;
          verdict_record vr;
          for (auto& c : cases)
            if (statement_digest(c.accusation) == d.accusation_digest) {
              vr.accusation = c.accusation;
              vr.outcome = c.outcome;
              vr.proof = c.proof;
            }
          vr.decision = *d.decision;
          vr.newly_banned = d.newly_banned;
          for (auto& b : d.newly_banned)
            newly.push_back(b);
          rec.verdicts.push_back(std::move(vr));
        }
        first = false;
      }
    }
    // Attackers' views follow (they are refused by every honest gate otherwise).
    for (auto& [k, p] : by_key)
      if (p->spec.byzantine())
        for (auto& b : newly)
          p->view.ban(b, "banned by the honest peers");
    std::sort(newly.begin(), newly.end());
    newly.erase(std::unique(newly.begin(), newly.end()), newly.end());
    return newly;
  }

  bool attacking(const peer& p, protocol_attack a, uint32_t attempt) const {
    return p.spec.protocol == a && p.spec.protocol_step == step && attempt == 0;
  }

  /// The aggregated vector of a part by the plain rules.
  result<std::vector<float>> plain(const std::vector<std::string>& members,
                                   const std::map<std::string, shared_vector>& sent,
                                   attempt_record& rec) {
    std::vector<const float*> in;
    for (auto& k : members)
      in.push_back(sent.at(k)->data());
    if (o.rule == aggregation_rule::mean)
      return mean_fp64(in, t->dim());
    // CenteredClip per part of the same equal split BTARD uses.
    auto parts = equal_parts(t->dim(), members.size());
    if (!parts)
      return fail(parts.error().what);
    std::vector<float> out(t->dim());
    std::vector<const float*> part_in(in.size());
    for (auto& r : *parts) {
      for (size_t j = 0; j < in.size(); ++j)
        part_in[j] = in[j] + r.begin;
      auto c = centered_clip_fp64(part_in, r.size(), o.tau, o.max_iterations, o.tolerance);
      if (!c)
        return fail(c.error().what);
      std::copy(c->value.begin(), c->value.end(),
                out.begin() + static_cast<std::ptrdiff_t>(r.begin));
      note_clip(rec, *c, part_in.size());
    }
    return out;
  }

  void apply(peer& p, const std::vector<piece>& pieces) {
    for (auto& pc : pieces)
      nesterov_step(p.params, p.velocity, pc.begin, pc.values, pc.size, o.lr, o.momentum);
  }

  result<step_record> run_step();
  result<bool> run_attempt(step_state& s, step_group& g, attempt_record& rec,
                           std::set<std::string>& removed, uint32_t& mprng_attempt,
                           std::map<std::string, std::vector<piece>>& applied);
  result<shared_vector> attacked(step_state& s, peer& p, const shared_vector& truth,
                                 const std::vector<std::string>& members);
};

result<simulated_group::impl::shared_vector>
simulated_group::impl::attacked(step_state& s, peer& p, const shared_vector& truth,
                                const std::vector<std::string>& members) {
  auto share = [](std::vector<float> v) {
    return std::make_shared<const std::vector<float>>(std::move(v));
  };
  auto& a = p.spec.gradient;
  if (a.kind == attack_kind::delayed && p.delayed)
    p.delayed->record(step, as_tensor(*truth).clone());
  if (a.kind == attack_kind::none || !attacks_at(a, step))
    return truth;
  auto g = as_tensor(*truth);
  switch (a.kind) {
  case attack_kind::sign_flip:
    return share(as_vector(sign_flip(g, a.scale)));
  case attack_kind::random_direction: {
    auto out = direction->apply({g}, a.scale);
    if (!out)
      return fail(out.error().what);
    return share(as_vector(out->front()));
  }
  case attack_kind::label_flip: {
    auto flipped = t->gradient(s.theta, s.seeds.at(p.pk), true);
    if (!flipped)
      return fail(flipped.error().what);
    return share(std::move(*flipped));
  }
  case attack_kind::delayed: {
    auto old = p.delayed->replay(step);
    return old ? share(as_vector(*old)) : truth;
  }
  case attack_kind::ipm:
  case attack_kind::alie: {
    // The honest statistics from every honest member's gradient, which attackers can recompute
    // from the public seeds (n − b gradients per step, shared among colluding attackers).
    if (!s.honest_stats) {
      std::vector<at::Tensor> honest;
      s.gradient_attackers = 0;
      for (auto& k : members) {
        auto* q = by_key.at(k);
        if (q->spec.gradient.kind != attack_kind::none) {
          ++s.gradient_attackers;
          continue;
        }
        auto tg = true_gradient(s, k);
        if (!tg)
          return tg;
        honest.push_back(as_tensor(**tg).clone());
      }
      auto stats = statistics_of(honest);
      if (!stats)
        return fail(stats.error().what);
      s.honest_stats = std::move(*stats);
    }
    const auto& stats = s.honest_stats;
    const size_t byz = s.gradient_attackers;
    if (a.kind == attack_kind::ipm)
      return share(as_vector(ipm(*stats, a.epsilon)));
    auto z = alie_z(members.size(), byz);
    if (!z)
      return fail(z.error().what);
    return share(as_vector(alie(*stats, *z)));
  }
  default:
    return truth;
  }
}

result<step_record> simulated_group::impl::run_step() {
  step_record out;
  out.step = step;
  out.r_prev = r_prev;
  for (auto& p : peers)
    if (p->spec.offline_at(step))
      p->stale = true;
  auto* ref = reference();
  if (!ref)
    return fail("no honest peer left");

  // Peers back from a crash download the state from an honest donor before they take part.
  for (auto& p : peers) {
    if (p->spec.offline_at(step))
      continue;
    if (p->stale && p.get() != ref && !ref->stale) {
      p->params = ref->params;
      p->velocity = ref->velocity;
      p->stale = false;
    }
    // Back after its cool-down: it joins again (its fresh commitments follow in this step).
    if (!p->stale && ref->view.absent(p->pk, step) == absence::not_joined)
      for (auto& q : peers)
        (void)q->view.join(p->pk, step);
  }

  auto grouped = ref->view.group(step, t->dim());
  step_group g;
  if (grouped)
    g = *grouped;
  // Members offline at this step stay in the group: they are found silent by the protocol.
  step_state s;
  s.step = step;
  s.theta = ref->params;
  std::vector<std::string> online;
  auto all_members = o.rule == aggregation_rule::btard ? g.members : std::vector<std::string>{};
  if (o.rule != aggregation_rule::btard)
    for (auto& [k, p] : by_key)
      all_members.push_back(k);
  for (auto& k : all_members) {
    s.seeds[k] = batch_seed(r_prev, k);
    auto* p = by_key.at(k);
    if (p->spec.offline_at(step) || p->stale)
      continue;
    online.push_back(k);
  }
  out.seeds = s.seeds;
  auto t_grad = std::chrono::steady_clock::now();
  for (auto& k : online) {
    auto* p = by_key.at(k);
    auto truth = t->gradient(p->params, s.seeds.at(k), false);
    if (!truth)
      return fail(truth.error().what);
    auto shared = std::make_shared<const std::vector<float>>(std::move(*truth));
    if (p->honest())
      s.recomputed.emplace(k, shared);
    s.truth.emplace(k, std::move(shared));
  }
  auto t_attack = std::chrono::steady_clock::now();
  out.ms_gradients = std::chrono::duration<double, std::milli>(t_attack - t_grad).count();
  for (auto& k : online) {
    auto sent = attacked(s, *by_key.at(k), s.truth.at(k), online);
    if (!sent)
      return fail(sent.error().what);
    if ((*sent)->size() != t->dim())
      return fail("an attack produced a vector of the wrong size");
    s.sent.emplace(k, std::move(*sent));
  }

  out.ms_attacks =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_attack)
          .count();
  std::map<std::string, std::vector<piece>> applied;
  if (o.rule != aggregation_rule::btard) {
    attempt_record rec;
    rec.members = online;
    if (online.size() >= 1) {
      phase_clock clock(rec.ms);
      // A butterfly all-reduce moves the same bytes as BTARD's parts and results.
      rec.bytes_data = 2 * (online.size() - 1) * t->dim() * sizeof(float);
      auto agg = plain(online, s.sent, rec);
      clock.lap("aggregate");
      if (!agg)
        return fail(agg.error().what);
      auto& kept = s.kept.emplace_back(std::move(*agg));
      for (auto& k : online)
        applied[k] = {piece{0, kept.data(), kept.size()}};
      rec.applied = true;
    }
    out.attempts.push_back(std::move(rec));
  } else if (grouped) {
    // Banned peers still online keep trying: each signs its commitment for the step and sends a
    // part to every member; honest readers ignore a banned signer's statements and aggregators
    // refuse its parts, counting both.
    for (auto& p : peers) {
      if (!ref->view.ban_reason(p->pk) || p->spec.offline_at(step))
        continue;
      std::vector<digest> ds(g.members.size(), digest{});
      auto st = sign_statement({statement_kind::part_digests, o.run_id, step, p->pk,
                                index_slot(0, 0), digests_payload(ds)},
                               p->key);
      if (st && verify(*st))
        ++out.refused_statements;
      out.refused_parts += g.members.size();
    }
    std::set<std::string> removed;
    uint32_t mprng_attempt = 0;
    for (uint32_t a = 0; a < o.max_attempts; ++a) {
      attempt_record rec;
      rec.attempt = a;
      auto done = run_attempt(s, g, rec, removed, mprng_attempt, applied);
      if (!done)
        return fail(done.error().what);
      out.attempts.push_back(std::move(rec));
      if (*done)
        break;
      auto again = ref->view.regroup(g, removed, t->dim());
      if (!again)
        break; // too few members: the step ends without an update
      g = *again;
      if (!ref->view.group(step, t->dim()))
        break;
    }
  }
  auto t_apply = std::chrono::steady_clock::now();
  for (auto& [k, agg] : applied) {
    apply(*by_key.at(k), agg);
    out.applied = true;
  }
  // A peer that did not apply this step's aggregate (removed, cooling down) downloads the state
  // before it takes part again.
  for (auto& p : peers)
    if (out.applied && !applied.count(p->pk))
      p->stale = true;
  out.contributors = applied.size();
  if (!out.attempts.empty() && out.attempts.back().r)
    r_prev = *out.attempts.back().r;
  else
    r_prev = skipped_randomness(r_prev);
  for (auto& p : peers)
    if (!p->spec.offline_at(step) && !p->stale && !p->view.ban_reason(p->pk))
      out.params[p->pk] = params_digest(p->params);
  out.ms_apply =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_apply).count();
  board.forget_before(step);
  ++step;
  return out;
}

result<bool>
simulated_group::impl::run_attempt(step_state& s, step_group& g, attempt_record& rec,
                                   std::set<std::string>& removed, uint32_t& mprng_attempt,
                                   std::map<std::string, std::vector<piece>>& applied) {
  const auto& members = g.members;
  const size_t n = members.size();
  rec.members = members;
  const uint32_t a = rec.attempt;
  phase_clock clock(rec.ms);
  auto slot = [&](uint64_t part) { return index_slot(a, part); };
  auto online = [&](const std::string& k) {
    auto* p = by_key.at(k);
    return !p->spec.offline_at(step) && !p->stale;
  };
  // The first honest aggregator other than `self` (where attacks aim to hurt).
  auto honest_target = [&](const std::string& self) -> std::optional<size_t> {
    for (size_t i = 0; i < n; ++i)
      if (members[i] != self && by_key.at(members[i])->honest() && online(members[i]))
        return i;
    return std::nullopt;
  };
  std::map<std::string, std::vector<digest>> committed; // key -> digest per part
  std::map<std::string, digest> cite;                   // key -> its part_digests statement
  // A NaN in the part an honest aggregator receives, committed to like any other value.
  for (auto& k : members) {
    auto* p = by_key.at(k);
    auto target = honest_target(k);
    if (!target || !online(k) || !attacking(*p, protocol_attack::non_finite_part, a))
      continue;
    auto poisoned = *s.sent.at(k);
    poisoned[g.parts[*target].begin] = std::numeric_limits<float>::quiet_NaN();
    s.sent[k] = std::make_shared<const std::vector<float>>(std::move(poisoned));
  }

  // 1. Commitments: every member's part digests (one signed statement), before any data moves.
  for (auto& k : members) {
    if (!online(k))
      continue;
    auto* p = by_key.at(k);
    auto& v = *s.sent.at(k);
    for (size_t i = 0; i < n; ++i)
      committed[k].push_back(clock.hash(step, i, v.data() + g.parts[i].begin, g.parts[i].size()));
    auto st =
        publish(rec, *p, statement_kind::part_digests, slot(0), digests_payload(committed[k]));
    if (!st)
      return fail(st.error().what);
    cite[k] = statement_digest(*st);
    if (attacking(*p, protocol_attack::equivocate_digest, a)) {
      auto other = committed[k];
      other[0][0] ^= 1;
      // A second replica gets another digest for part 0; honest readers re-store both.
      auto second = publish(rec, *p, statement_kind::part_digests, slot(0), digests_payload(other));
      if (!second)
        return fail(second.error().what);
    }
  }
  std::vector<std::string> condemned;
  for (auto& k : members)
    if (board.condemned(k))
      condemned.push_back(k);
  for (auto& k : members)
    if (!online(k))
      rec.silent.push_back(k);
  if (!rec.silent.empty() || !condemned.empty()) {
    for (auto& k : rec.silent) {
      removed.insert(k);
      bool banned_now = false;
      for (auto& [q, p] : by_key)
        banned_now = p->view.silent(k, step) || banned_now;
      if (banned_now)
        rec.banned.push_back(k);
    }
    for (auto& k : condemned) {
      removed.insert(k);
      rec.proofs.push_back(board.proofs().find(k)->second);
    }
    auto more = decide(rec, {}, condemned);
    rec.banned.insert(rec.banned.end(), more.begin(), more.end());
    return false;
  }

  clock.lap("commit");
  // 2. Deliveries: part i of every member to member i, checked against the commitment. A part
  // "sent" is its sender's values in place (the network is simulated and the plain mean reads
  // them in place too); a part other than the sender's own values is a copy kept in `copies`.
  std::deque<std::vector<float>> copies;
  std::vector<std::map<std::string, const float*>> inbox(n);
  for (auto& k : members) {
    auto* p = by_key.at(k);
    auto target = honest_target(k);
    const float* mine = s.sent.at(k)->data();
    for (size_t i = 0; i < n; ++i) {
      const float* part = mine + g.parts[i].begin;
      if (target && i == *target && attacking(*p, protocol_attack::missing_part, a))
        continue;
      if (target && i == *target && attacking(*p, protocol_attack::part_not_committed, a)) {
        auto& other = copies.emplace_back(part, part + g.parts[i].size());
        for (auto& x : other)
          x *= -1.0f;
        part = other.data();
      }
      inbox[i].emplace(k, part);
    }
  }
  std::vector<accusation_case> cases;
  for (size_t i = 0; i < n; ++i) {
    auto* agg = by_key.at(members[i]);
    if (!agg->honest())
      continue;
    for (auto& k : members) {
      if (k == members[i])
        continue; // its own part: nothing arrived, and it hashed the part to commit to it
      auto it = inbox[i].find(k);
      bool ok = it != inbox[i].end() &&
                clock.hash(step, i, it->second, g.parts[i].size()) == committed.at(k)[i];
      if (ok && !finite_values(it->second, g.parts[i].size())) {
        // The part is the one committed to, so the proof is public: anyone who fetches it
        // (checked against the commitment) sees the non-finite value. No gradient is.
        if (auto st = accuse(rec, cases, *agg, k, accusation_kind::wrong_gradient, slot(i),
                             {cite.at(k)}, recheck::confirmed);
            !st)
          return fail(st.what());
        continue;
      }
      if (ok)
        continue;
      if (auto st = accuse(rec, cases, *agg, k, accusation_kind::missing_part, slot(i),
                           {cite.at(k)}, recheck::undecidable);
          !st)
        return fail(st.what());
    }
  }
  if (!cases.empty()) {
    settle(rec, cases, removed);
    return false;
  }

  clock.lap("deliver");
  rec.bytes_data += (n - 1) * t->dim() * sizeof(float);
  // 3. Aggregation: CenteredClip (fp64) of part i by member i, its digest published first.
  std::vector<std::vector<float>> results(n);
  std::vector<digest> result_digest(n);
  std::vector<std::map<std::string, const float*>> received(n); // part i as each got it
  for (size_t i = 0; i < n; ++i) {
    auto* p = by_key.at(members[i]);
    std::vector<const float*> in;
    for (auto& k : members) {
      if (attacking(*p, protocol_attack::leave_one_out, a) && k == members[i == 0 ? 1 : 0])
        continue;
      in.push_back(inbox[i].at(k));
    }
    double tau = attacking(*p, protocol_attack::other_tau, a) ? o.tau / 4 : o.tau;
    auto c = centered_clip_fp64(in, g.parts[i].size(), tau, o.max_iterations, o.tolerance);
    if (!c)
      return fail(c.error().what);
    note_clip(rec, *c, in.size());
    results[i] = std::move(c->value);
    if (attacking(*p, protocol_attack::gross_aggregate, a))
      for (auto& x : results[i])
        x += static_cast<float>(o.tau);
    if (attacking(*p, protocol_attack::non_finite_result, a) && !results[i].empty())
      results[i][0] = std::numeric_limits<float>::quiet_NaN();
    result_digest[i] = clock.hash(step, i, results[i].data(), results[i].size());
    auto st =
        publish(rec, *p, statement_kind::result_digest, slot(i), digest_payload(result_digest[i]));
    if (!st)
      return fail(st.error().what);
    auto victim = honest_target(members[i]);
    for (auto& k : members) {
      const float* r = results[i].data();
      if (victim && k == members[*victim] && attacking(*p, protocol_attack::different_results, a)) {
        auto& other = copies.emplace_back(results[i]);
        for (auto& x : other)
          x *= 0.5f;
        r = other.data();
      }
      received[i].emplace(k, r);
    }
  }
  clock.lap("aggregate");
  rec.bytes_data += (n - 1) * t->dim() * sizeof(float);
  // Receivers check each result against its digest; a mismatch is a disputed delivery.
  std::set<size_t> non_finite_accused; // parts whose aggregator one honest receiver accused
  for (auto& k : members) {
    auto* p = by_key.at(k);
    if (!p->honest())
      continue;
    for (size_t i = 0; i < n; ++i) {
      // The aggregator holds its own result (it hashed it to publish the digest).
      if (k == members[i])
        continue;
      if (clock.hash(step, i, received[i].at(k), g.parts[i].size()) == result_digest[i]) {
        if (finite_values(received[i].at(k), g.parts[i].size()) ||
            !non_finite_accused.insert(i).second)
          continue; // fine, or accused already: the others read the accusation
        // The result it committed to is non-finite: CenteredClip of parts that each passed the
        // finite check cannot be, and a non-finite part of its own is as wrong (public proof).
        if (auto st = accuse(rec, cases, *p, members[i], accusation_kind::wrong_aggregate, slot(i),
                             {statement_digest(*board.find(statement_kind::result_digest, step,
                                                           members[i], slot(i)))},
                             recheck::confirmed);
            !st)
          return fail(st.what());
        continue;
      }
      if (auto st = accuse(rec, cases, *p, members[i], accusation_kind::missing_part, slot(i),
                           {statement_digest(*board.find(statement_kind::result_digest, step,
                                                         members[i], slot(i)))},
                           recheck::undecidable);
          !st)
        return fail(st.what());
    }
  }
  if (!cases.empty()) {
    settle(rec, cases, removed);
    return false;
  }

  clock.lap("deliver");
  // 4. MPRNG, now that every commitment of the aggregation is public.
  rec.mprng_attempt = mprng_attempt;
  auto round = mprng_round::start(step, mprng_attempt, members);
  if (!round)
    return fail(round.error().what);
  ++mprng_attempt;
  std::map<std::string, digest> secret;
  for (auto& k : members) {
    auto* p = by_key.at(k);
    auto r = mprng_secret(p->key, step, round->attempt());
    secret[k] = r;
    auto c = mprng_commitment(step, round->attempt(), k, r);
    if (auto st = round->add_commit(k, c); !st)
      return fail(st.what());
    auto pub = publish(rec, *p, statement_kind::mprng_commit, index_slot(round->attempt(), 0),
                       digest_payload(c));
    if (!pub)
      return fail(pub.error().what);
  }
  round->close_commits();
  for (auto& k : members) {
    auto* p = by_key.at(k);
    if (attacking(*p, protocol_attack::withhold_reveal, a))
      continue;
    if (auto st = round->add_reveal(k, secret[k]); !st)
      return fail(st.what());
    auto pub = publish(rec, *p, statement_kind::mprng_reveal, index_slot(round->attempt(), 0),
                       digest_payload(secret[k]));
    if (!pub)
      return fail(pub.error().what);
  }
  auto drawn = round->finish();
  if (!drawn.withholders.empty() || !drawn.value) {
    // A withheld reveal is a ban; its contribution is in the aggregates, so the aggregation is
    // redone without it (with a fresh draw, as mprng.hpp asks of a redone aggregation).
    std::vector<std::string> ban = drawn.withholders;
    for (auto& k : drawn.silent)
      ban.push_back(k);
    for (auto& [q, p] : by_key)
      for (auto& k : ban)
        p->view.ban(k, "withheld its MPRNG reveal");
    rec.banned = ban;
    removed.insert(ban.begin(), ban.end());
    return false;
  }
  rec.r = *drawn.value;
  const digest& r = *drawn.value;

  clock.lap("mprng");
  // 5. Projections and the aggregate check.
  std::vector<std::vector<double>> z(n);
  std::vector<std::map<std::string, projection>> pairs(n);
  for (size_t i = 0; i < n; ++i)
    z[i] = gaussian_direction(direction_seed(r, i), g.parts[i].size());
  // Every member projects each of its parts against the result it received (part by part, so
  // that a part's direction is read by every member while it is in cache), then publishes.
  std::map<std::string, std::vector<std::pair<double, double>>> mine_all;
  for (size_t i = 0; i < n; ++i)
    for (auto& k : members) {
      auto* p = by_key.at(k);
      auto target = honest_target(k);
      const float* mine = s.sent.at(k)->data() + g.parts[i].begin;
      auto pr = project(z[i].data(), mine, received[i].at(k), g.parts[i].size());
      if (target && i == *target && attacking(*p, protocol_attack::lie_projection, a))
        pr.s = pr.s * 1.01 + 1e-3 * pr.n;
      pairs[i][k] = pr;
      mine_all[k].emplace_back(pr.s, pr.n);
    }
  for (auto& k : members) {
    auto st = publish(rec, *by_key.at(k), statement_kind::projections, slot(0),
                      projections_payload(mine_all[k]));
    if (!st)
      return fail(st.error().what);
  }
  aggregate_check_options co;
  co.tau = o.tau;
  co.tolerance = o.tolerance;
  co.sigmas = o.sigmas;
  auto proj_cite = [&](const std::string& k) {
    return statement_digest(*board.find(statement_kind::projections, step, k, slot(0)));
  };
  // Re-checks are pure functions of public values: computed once, the outcome shared.
  auto pair_true = [&](const std::string& k, size_t i) {
    return project(z[i].data(), inbox[i].at(k), results[i].data(), g.parts[i].size());
  };
  auto recompute_part = [&](size_t i) -> result<std::vector<float>> {
    std::vector<const float*> in;
    for (auto& k : members)
      in.push_back(inbox[i].at(k));
    auto c = centered_clip_fp64(in, g.parts[i].size(), o.tau, o.max_iterations, o.tolerance);
    if (!c)
      return fail(c.error().what);
    return c->value;
  };
  std::set<std::pair<std::string, size_t>> projection_accused;
  for (size_t i = 0; i < n; ++i) {
    auto* agg = by_key.at(members[i]);
    double znorm = norm_of(z[i].data(), z[i].size());
    if (agg->honest())
      for (auto& k : members) {
        // Its own pair it computed itself.
        if (k == members[i] ||
            projection_matches(pairs[i][k], pair_true(k, i), znorm, co.projection_rel_tolerance))
          continue;
        if (auto st = accuse(rec, cases, *agg, k, accusation_kind::wrong_projection, slot(i),
                             {proj_cite(k), cite.at(k)}, recheck::confirmed);
            !st)
          return fail(st.what());
        projection_accused.insert({k, i});
      }
    part_facts facts{g.parts[i].size(), norm_of(results[i].data(), results[i].size()), znorm};
    auto checked = check_aggregate(pairs[i], facts, co);
    if (!checked)
      return fail(checked.error().what);
    rec.checks.push_back(
        {i, facts.aggregate_norm, checked->residual, checked->bound, checked->accepted});
    if (checked->accepted)
      continue;
    auto* filer = reference();
    // The filer fetches the part's contributions (each checked against its commitment) and
    // recomputes before accusing, so a lying projection is not blamed on the aggregator.
    auto again = recompute_part(i);
    if (!again)
      return fail(again.error().what);
    if (clock.hash(step, i, again->data(), again->size()) != result_digest[i]) {
      if (auto st =
              accuse(rec, cases, *filer, members[i], accusation_kind::wrong_aggregate, slot(i),
                     {statement_digest(
                         *board.find(statement_kind::result_digest, step, members[i], slot(i)))},
                     recheck::confirmed);
          !st)
        return fail(st.what());
      continue;
    }
    bool blamed = false;
    for (auto& k : members) {
      if (projection_accused.count({k, i})) {
        blamed = true;
        continue;
      }
      if (projection_matches(pairs[i][k], pair_true(k, i), znorm, co.projection_rel_tolerance))
        continue;
      if (auto st = accuse(rec, cases, *filer, k, accusation_kind::wrong_projection, slot(i),
                           {proj_cite(k), cite.at(k)}, recheck::confirmed);
          !st)
        return fail(st.what());
      projection_accused.insert({k, i});
      blamed = true;
    }
    // The recomputation from the committed parts gave the published digest and every pair is
    // true: the aggregate is right (CenteredClip stopped by the iteration cap before its step
    // fell below the tolerance), verified the expensive way.
    if (!blamed)
      rec.checks.back().recomputed = true;
  }

  clock.lap("check");
  // 6. Validators recompute their targets' gradients from the public seeds.
  validator_options vo;
  vo.count = std::min(o.validators, n >= 2 ? n - 1 : 0);
  auto vals = draw_validators(r, members, {}, vo);
  if (!vals)
    return fail(vals.error().what);
  rec.validations = *vals;
  auto gradient_ok = [&](const std::string& target) -> result<bool> {
    // A validator computes the target's gradient itself, even where the engine holds it already
    // (an honest target's own): the step's time counts one gradient per validator.
    auto truth = t->gradient(s.theta, s.seeds.at(target), false);
    if (!truth)
      return fail(truth.error().what);
    for (size_t i = 0; i < n; ++i) {
      if (o.validation_rel_tolerance == 0.0) {
        if (clock.hash(step, i, truth->data() + g.parts[i].begin, g.parts[i].size()) !=
            committed.at(target)[i])
          return false;
        continue;
      }
      // Fetched from aggregator i, checked against the commitment.
      const float* sent = s.sent.at(target)->data() + g.parts[i].begin;
      const float* want = truth->data() + g.parts[i].begin;
      double diff = 0, norm = 0;
      for (size_t k = 0; k < g.parts[i].size(); ++k) {
        diff += (double(sent[k]) - want[k]) * (double(sent[k]) - want[k]);
        norm += double(want[k]) * want[k];
      }
      // Written so that a NaN anywhere is a mismatch.
      if (!(std::sqrt(diff) <= o.validation_rel_tolerance * std::sqrt(norm)))
        return false;
    }
    return true;
  };
  auto gradient_cite = [&](const std::string& k) { return std::vector<digest>{cite.at(k)}; };
  for (auto& v : *vals) {
    auto* p = by_key.at(v.validator);
    if (!p->honest())
      continue;
    auto ok = gradient_ok(v.target);
    if (!ok)
      return fail(ok.error().what);
    if (*ok)
      continue;
    if (auto st = accuse(rec, cases, *p, v.target, accusation_kind::wrong_gradient, slot(0),
                         gradient_cite(v.target), recheck::confirmed);
        !st)
      return fail(st.what());
  }
  for (auto& k : members) {
    auto* p = by_key.at(k);
    if (!attacking(*p, protocol_attack::false_accusation, a))
      continue;
    auto victim = honest_target(k);
    if (!victim)
      continue;
    auto ok = gradient_ok(members[*victim]);
    if (!ok)
      return fail(ok.error().what);
    if (auto st =
            accuse(rec, cases, *p, members[*victim], accusation_kind::wrong_gradient, slot(0),
                   gradient_cite(members[*victim]), *ok ? recheck::refuted : recheck::confirmed);
        !st)
      return fail(st.what());
  }

  clock.lap("validate");
  // 7. Verdicts, each honest peer on its own; any ban means a redo without the banned.
  if (!cases.empty() && settle(rec, cases, removed))
    return false;
  for (auto& c : rec.checks)
    if (!c.accepted && !c.recomputed)
      return fail(fmt::format("step {}: part {}'s aggregate failed the check and nobody was found "
                              "to blame (residual {:.3g} > bound {:.3g})",
                              step, c.part, c.residual, c.bound));
  clock.lap("verdicts");
  // 8. Every member applies the results it received and checked, part by part.
  for (auto& k : members) {
    std::vector<piece> pieces;
    for (size_t i = 0; i < n; ++i)
      pieces.push_back({g.parts[i].begin, received[i].at(k), g.parts[i].size()});
    applied[k] = std::move(pieces);
  }
  // The pieces point into the results and copies: they live as long as the step.
  for (auto& r : results)
    s.kept.push_back(std::move(r));
  for (auto& c : copies)
    s.kept.push_back(std::move(c));
  rec.applied = true;
  return true;
}

// --- the public face -----------------------------------------------------------------------------

simulated_group::simulated_group(std::unique_ptr<impl> p) : p_(std::move(p)) {}
simulated_group::~simulated_group() = default;

result<std::unique_ptr<simulated_group>> simulated_group::make(const group_options& o,
                                                               std::shared_ptr<const task> t,
                                                               std::vector<peer_spec> specs,
                                                               std::vector<auth::key_pair> keys) {
  if (auto st = validate(o); !st)
    return fail(st.what());
  if (!t)
    return fail("no task");
  if (specs.size() != keys.size())
    return fail(fmt::format("{} peers but {} keys", specs.size(), keys.size()));
  if (specs.size() < 2)
    return fail("a group needs at least 2 peers");
  auto p = std::make_unique<impl>(o, std::move(t));
  p->r_prev = initial_randomness(o.run_id, o.seed);
  auto init = p->t->initial();
  if (init.size() != p->t->dim())
    return fail("the task's initial parameters have the wrong size");
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto st = validate(specs[i].gradient); !st)
      return fail(fmt::format("peer {}: {}", i, st.what()));
    auto q = std::make_unique<impl::peer>(std::move(keys[i]), i, specs[i], o.membership);
    q->params = init;
    q->velocity.assign(init.size(), 0.0f);
    if (specs[i].gradient.kind == attack_kind::delayed)
      q->delayed = std::make_unique<delayed_gradients>(specs[i].gradient);
    if (!p->by_key.emplace(q->pk, q.get()).second)
      return fail(fmt::format("peer {} has the key of another peer", i));
    p->peers.push_back(std::move(q));
  }
  for (auto& q : p->peers)
    for (auto& [k, other] : p->by_key)
      if (auto st = q->view.join(k, 0); !st)
        return fail(st.what());
  for (auto& s : specs)
    if (s.gradient.kind == attack_kind::random_direction) {
      p->direction = std::make_unique<random_direction_attack>(
          s.gradient.direction_seed, std::vector<std::vector<int64_t>>{{int64_t(p->t->dim())}});
      break;
    }
  return std::unique_ptr<simulated_group>(new simulated_group(std::move(p)));
}

result<step_record> simulated_group::step() {
  torch::NoGradGuard off;
  return p_->run_step();
}

uint64_t simulated_group::next_step() const {
  return p_->step;
}
size_t simulated_group::size() const {
  return p_->peers.size();
}
const std::string& simulated_group::key_of(size_t i) const {
  return p_->peers.at(i)->pk;
}
std::optional<size_t> simulated_group::index_of(const std::string& key) const {
  auto it = p_->by_key.find(key);
  if (it == p_->by_key.end())
    return std::nullopt;
  return it->second->index;
}
const peer_spec& simulated_group::spec_of(size_t i) const {
  return p_->peers.at(i)->spec;
}
const std::vector<float>& simulated_group::params_of(size_t i) const {
  return p_->peers.at(i)->params;
}
const std::map<std::string, std::string>& simulated_group::bans_of(size_t i) const {
  return p_->peers.at(i)->view.banned();
}
const std::vector<float>& simulated_group::model() const {
  return p_->first_honest()->params;
}
const task& simulated_group::model_task() const {
  return *p_->t;
}
const group_options& simulated_group::options() const {
  return p_->o;
}

} // namespace starling::actors::btard
