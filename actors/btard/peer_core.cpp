#include "actors/btard/peer_core.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/auth/identity.hpp"
#include "actors/btard/bytes.hpp"
#include "actors/btard/step_util.hpp"

namespace starling::actors::btard {

bool data_ref::operator<(const data_ref& o) const {
  return std::tie(step, attempt, kind, part, sender, committed) <
         std::tie(o.step, o.attempt, o.kind, o.part, o.sender, o.committed);
}

bool data_ref::operator==(const data_ref& o) const {
  return !(*this < o) && !(o < *this);
}

const char* phase_name(peer_phase p) {
  switch (p) {
  case peer_phase::commit:
    return "commit";
  case peer_phase::aggregate:
    return "aggregate";
  case peer_phase::results:
    return "results";
  case peer_phase::reveal:
    return "reveal";
  case peer_phase::project:
    return "project";
  case peer_phase::check:
    return "check";
  case peer_phase::idle:
    return "idle";
  case peer_phase::banned:
    return "banned";
  }
  return "unknown";
}

status validate(const peer_core_options& o) {
  if (o.group.rule != aggregation_rule::btard)
    return fail("a BTARD peer runs the btard rule (the plain rules need no protocol)");
  if (auto st = validate(o.group); !st)
    return st;
  if (auto st = validate(o.gradient); !st)
    return st;
  if ((o.gradient.kind == attack_kind::ipm || o.gradient.kind == attack_kind::alie) &&
      o.colluders.empty())
    return fail(fmt::format("the {} attack needs its colluders' keys (it takes the honest "
                            "statistics from every other peer's gradient)",
                            attack_name(o.gradient.kind)));
  return {};
}

namespace {

constexpr size_t phase_count = 6;

} // namespace

struct peer_core::impl {
  peer_core_options o;
  std::shared_ptr<const task> t;
  auth::key_pair key;
  std::string pk;
  std::vector<std::string> everyone;
  membership view;
  /// The membership as the running step began (before its cooled-down peers rejoined): what
  /// `export_state` gives during a step, whose parameters, momentum and randomness change
  /// only at its end.
  std::string view_at_start;
  /// The members that came back at this step's start (cooled down, joined again).
  std::set<std::string> coming_back;
  std::vector<float> params, velocity;
  digest r_prev{};
  uint64_t step = 0;
  peer_phase phase = peer_phase::idle;
  std::unique_ptr<random_direction_attack> direction;
  std::unique_ptr<delayed_gradients> delayed;
  ledger board;
  uint64_t refused = 0;

  // -- the step ------------------------------------------------------------------------------
  std::map<std::string, uint64_t> seeds;
  std::vector<float> truth, sent;
  /// Gradients recomputed for re-checks and validation this step, by key.
  std::map<std::string, std::vector<float>> recomputed;
  step_record record;
  std::optional<step_record> finished;
  std::set<std::string> removed;
  uint32_t mprng_attempt = 0;
  std::chrono::steady_clock::time_point step_start;

  // -- the attempt ---------------------------------------------------------------------------
  uint32_t a = 0;
  step_group g;
  attempt_record rec;
  /// Statements of the step by `statement_digest` (what markers cite).
  std::map<digest, signed_statement> by_digest;
  /// Those already in an earlier attempt's record.
  std::set<digest> logged;
  /// Members seen in a later aggregation of this step (phase_done markers), by attempt.
  std::map<uint32_t, std::set<std::string>> later;
  std::map<data_ref, std::vector<float>> data;
  std::vector<digest> filed; // accusations this peer filed in the current phase
  std::optional<mprng_round> round;
  digest secret{};
  std::optional<digest> r;
  std::vector<std::vector<double>> z;
  std::vector<statement> pending_publish;
  std::vector<signed_statement> out_statements;
  std::vector<std::pair<data_ref, std::vector<float>>> out_data;

  impl(const peer_core_options& po, std::shared_ptr<const task> task, auth::key_pair k)
      : o(po), t(std::move(task)), key(std::move(k)), pk(key.public_key()),
        view(po.group.membership), board(po.group.run_id) {}

  size_t n() const { return g.members.size(); }
  std::optional<size_t> mine() const { return g.index_of(pk); }
  std::string slot(uint64_t index) const { return index_slot(a, index); }
  bool byzantine() const {
    return o.gradient.kind != attack_kind::none || o.protocol != protocol_attack::none;
  }
  bool attacking(protocol_attack x) const {
    return o.protocol == x && o.protocol_step == step && a == 0;
  }
  /// Where an attack aims: the first member other than itself.
  std::optional<size_t> target() const {
    for (size_t i = 0; i < n(); ++i)
      if (g.members[i] != pk)
        return i;
    return std::nullopt;
  }

  status publish(statement_kind kind, std::string s, std::string payload) {
    statement st{kind, o.group.run_id, step, pk, std::move(s), std::move(payload)};
    auto signed_st = sign_statement(std::move(st), key);
    if (!signed_st)
      return fail(signed_st.error().what);
    (void)board.add(*signed_st);
    by_digest.emplace(statement_digest(*signed_st), *signed_st);
    rec.statements.push_back(*signed_st);
    rec.bytes_statements += encode(*signed_st).size();
    out_statements.push_back(*signed_st);
    return {};
  }

  status publish_data(data_kind kind, uint64_t part, const float* values, size_t size,
                      const digest& d) {
    data_ref ref{step, a, kind, part, pk, d};
    std::vector<float> v(values, values + size);
    data[ref] = v;
    rec.bytes_data += size * sizeof(float);
    out_data.emplace_back(ref, std::move(v));
    return {};
  }

  status mark_done(peer_phase p) {
    auto st = publish(statement_kind::phase_done, slot(static_cast<uint64_t>(p)),
                      phase_done_payload(filed));
    filed.clear();
    return st;
  }

  status accuse(const std::string& accused, accusation_kind kind, std::string subject,
                std::vector<digest> evidence) {
    accusation x;
    x.accused = accused;
    x.kind = kind;
    x.subject = std::move(subject);
    if (evidence.size() > max_evidence)
      evidence.resize(max_evidence);
    x.evidence = std::move(evidence);
    auto slot_of = accusation_slot(x);
    auto payload = accusation_payload(x);
    if (auto st = publish(statement_kind::accusation, slot_of, payload); !st)
      return st;
    filed.push_back(statement_digest(rec.statements.back()));
    return {};
  }

  const signed_statement* find(statement_kind kind, const std::string& signer,
                               const std::string& s) const {
    return board.find(kind, step, signer, s);
  }

  const signed_statement* marker(const std::string& k, peer_phase p) const {
    return find(statement_kind::phase_done, k, slot(static_cast<uint64_t>(p)));
  }

  /// The digests member `k` committed to for its parts (empty when absent or malformed).
  std::vector<digest> committed(const std::string& k) const {
    auto* s = find(statement_kind::part_digests, k, slot(0));
    if (!s)
      return {};
    auto d = parse_digests_payload(s->body.payload);
    if (!d || d->size() != n())
      return {};
    return *d;
  }

  std::optional<digest> result_digest_of(size_t i) const {
    auto* s = find(statement_kind::result_digest, g.members[i], slot(i));
    if (!s)
      return std::nullopt;
    auto d = digest_of_string(s->body.payload);
    if (!d)
      return std::nullopt;
    return *d;
  }

  const std::vector<float>* datum(const data_ref& ref) const {
    auto it = data.find(ref);
    return it == data.end() ? nullptr : &it->second;
  }

  std::optional<data_ref> part_ref(size_t i, const std::string& sender) const {
    auto c = committed(sender);
    if (c.empty())
      return std::nullopt;
    return data_ref{step, a, data_kind::part, i, sender, c[i]};
  }

  std::optional<data_ref> result_ref(size_t i) const {
    auto d = result_digest_of(i);
    if (!d)
      return std::nullopt;
    return data_ref{step, a, data_kind::result, i, g.members[i], *d};
  }

  /// A contribution of `sender` to part i: its own values for its own, else the board's.
  const float* contribution(size_t i, const std::string& sender) const {
    if (sender == pk)
      return sent.data() + g.parts[i].begin;
    auto ref = part_ref(i, sender);
    if (!ref)
      return nullptr;
    auto* v = datum(*ref);
    return v ? v->data() : nullptr;
  }

  const float* result_values(size_t i) const {
    auto ref = result_ref(i);
    if (!ref)
      return nullptr;
    auto* v = datum(*ref);
    return v ? v->data() : nullptr;
  }

  /// The accusations the members' markers of phase `p` list (present ones), in marker order.
  std::vector<const signed_statement*> listed(peer_phase p, bool* complete = nullptr) const {
    std::vector<const signed_statement*> out;
    bool all = true;
    for (auto& k : g.members) {
      auto* m = marker(k, p);
      if (!m)
        continue;
      auto ds = parse_phase_done_payload(m->body.payload);
      if (!ds)
        continue;
      for (auto& d : *ds) {
        auto it = by_digest.find(d);
        if (it == by_digest.end() || it->second.body.kind != statement_kind::accusation) {
          all = false;
          continue;
        }
        out.push_back(&it->second);
      }
    }
    if (complete)
      *complete = all;
    return out;
  }

  /// The part index an accusation's subject names in this attempt.
  std::optional<size_t> subject_part(const accusation& x) const {
    auto parsed = parse_index_slot(x.subject);
    if (!parsed || parsed->first != a || parsed->second >= n())
      return std::nullopt;
    return static_cast<size_t>(parsed->second);
  }

  void want_contributions(size_t i, std::vector<data_ref>& out) const {
    for (auto& k : g.members) {
      if (k == pk)
        continue;
      auto ref = part_ref(i, k);
      if (ref && !datum(*ref))
        out.push_back(*ref);
    }
  }

  void want_all_parts(const std::string& k, std::vector<data_ref>& out) const {
    if (k == pk)
      return;
    for (size_t i = 0; i < n(); ++i) {
      auto ref = part_ref(i, k);
      if (ref && !datum(*ref))
        out.push_back(*ref);
    }
  }

  /// The data the re-checks of the listed accusations of phase `p` need.
  void want_rechecks(peer_phase p, std::vector<data_ref>& out) const {
    for (auto* s : listed(p)) {
      auto x = parse_accusation(s->body.payload);
      if (!x)
        continue;
      auto i = subject_part(*x);
      switch (x->kind) {
      case accusation_kind::wrong_gradient:
        if (o.group.validation_rel_tolerance > 0.0)
          want_all_parts(x->accused, out);
        break;
      case accusation_kind::wrong_aggregate:
        if (i)
          want_contributions(*i, out);
        break;
      case accusation_kind::wrong_projection:
        if (i && x->accused != pk) {
          auto ref = part_ref(*i, x->accused);
          if (ref && !datum(*ref))
            out.push_back(*ref);
        }
        break;
      default:
        break;
      }
    }
  }

  std::vector<data_ref> wanted() const {
    std::vector<data_ref> out;
    switch (phase) {
    case peer_phase::commit:
      if (auto m = mine())
        want_contributions(*m, out);
      break;
    case peer_phase::aggregate:
      want_rechecks(phase, out);
      for (size_t i = 0; i < n(); ++i) {
        if (g.members[i] == pk)
          continue;
        auto ref = result_ref(i);
        if (ref && !datum(*ref))
          out.push_back(*ref);
      }
      break;
    case peer_phase::results:
      want_rechecks(phase, out);
      break;
    case peer_phase::project:
      // Parts whose aggregate check fails are recomputed from every contribution; a validator
      // comparing with a tolerance needs its target's parts.
      for (size_t i : failing_checks())
        want_contributions(i, out);
      if (r && o.group.validation_rel_tolerance > 0.0)
        for (auto& v : validations())
          if (v.validator == pk)
            want_all_parts(v.target, out);
      break;
    case peer_phase::check:
      want_rechecks(phase, out);
      break;
    default:
      break;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  bool ready() const {
    if (phase == peer_phase::idle || phase == peer_phase::banned)
      return false;
    for (auto& k : g.members)
      if (!marker(k, phase))
        return false;
    bool complete = true;
    (void)listed(phase, &complete);
    return complete && wanted().empty();
  }

  // -- pairs, checks, validations ------------------------------------------------------------
  std::map<std::string, projection> pairs_of(size_t i) const {
    std::map<std::string, projection> out;
    for (auto& k : g.members) {
      auto* s = find(statement_kind::projections, k, slot(0));
      if (!s)
        continue;
      auto p = parse_projections_payload(s->body.payload);
      if (!p || p->size() != n())
        continue;
      out[k] = projection{(*p)[i].first, (*p)[i].second};
    }
    return out;
  }

  aggregate_check_options check_options() const {
    aggregate_check_options co;
    co.tau = o.group.tau;
    co.tolerance = o.group.tolerance;
    co.sigmas = o.group.sigmas;
    return co;
  }

  std::optional<aggregate_check_outcome> check_part(size_t i) const {
    auto pairs = pairs_of(i);
    const float* res = result_values(i);
    if (pairs.size() != n() || !res || i >= z.size())
      return std::nullopt;
    part_facts facts{g.parts[i].size(), norm_of(res, g.parts[i].size()),
                     norm_of(z[i].data(), z[i].size())};
    auto c = check_aggregate(pairs, facts, check_options());
    if (!c)
      return std::nullopt;
    return *c;
  }

  std::vector<size_t> failing_checks() const {
    std::vector<size_t> out;
    if (!r)
      return out;
    for (size_t i = 0; i < n(); ++i) {
      auto c = check_part(i);
      if (c && !c->accepted)
        out.push_back(i);
    }
    return out;
  }

  std::vector<validation> validations() const {
    validator_options vo;
    vo.count = std::min(o.group.validators, n() >= 2 ? n() - 1 : 0);
    if (!r || vo.count == 0)
      return {};
    auto v = draw_validators(*r, g.members, {}, vo);
    return v ? *v : std::vector<validation>{};
  }

  // -- re-checks -----------------------------------------------------------------------------
  result<const std::vector<float>*> true_gradient(const std::string& k) {
    if (k == pk)
      return &truth;
    auto it = recomputed.find(k);
    if (it == recomputed.end()) {
      auto seed = seeds.find(k);
      if (seed == seeds.end())
        return fail("no batch seed for that peer");
      auto gr = t->gradient(record_theta(), seed->second, false);
      if (!gr)
        return fail(gr.error().what);
      it = recomputed.emplace(k, std::move(*gr)).first;
    }
    return &it->second;
  }

  std::vector<float> theta_at_step;
  const std::vector<float>& record_theta() const { return theta_at_step; }

  /// Whether `k`'s committed parts are its true gradient (bitwise by digest, or within the
  /// relative tolerance against its parts on the board; a part missing from the board is not).
  result<bool> gradient_ok(const std::string& k) {
    auto tg = true_gradient(k);
    if (!tg)
      return fail(tg.error().what);
    const auto& truth_k = **tg;
    auto c = committed(k);
    if (c.empty())
      return false;
    for (size_t i = 0; i < n(); ++i) {
      const float* want = truth_k.data() + g.parts[i].begin;
      if (o.group.validation_rel_tolerance == 0.0) {
        if (part_digest(step, i, want, g.parts[i].size()) != c[i])
          return false;
        continue;
      }
      const float* got = contribution(i, k);
      if (!got)
        return false;
      double diff = 0, norm = 0;
      for (size_t e = 0; e < g.parts[i].size(); ++e) {
        diff += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
        norm += double(want[e]) * want[e];
      }
      if (!(std::sqrt(diff) <= o.group.validation_rel_tolerance * std::sqrt(norm)))
        return false;
    }
    return true;
  }

  /// CenteredClip of part i from every committed contribution (nullopt: one is not on the board).
  result<std::optional<std::vector<float>>> recompute_part(size_t i) const {
    std::vector<const float*> in;
    for (auto& k : g.members) {
      const float* c = contribution(i, k);
      if (!c)
        return std::optional<std::vector<float>>{};
      in.push_back(c);
    }
    auto c = centered_clip_fp64(in, g.parts[i].size(), o.group.tau, o.group.max_iterations,
                                o.group.tolerance);
    if (!c)
      return fail(c.error().what);
    return std::optional<std::vector<float>>{std::move(c->value)};
  }

  /// This peer's re-check of one accusation, from public values.
  result<recheck> recheck_of(const accusation& x) {
    auto i = subject_part(x);
    switch (x.kind) {
    case accusation_kind::missing_part:
      return recheck::undecidable;
    case accusation_kind::wrong_gradient: {
      auto ok = gradient_ok(x.accused);
      if (!ok)
        return fail(ok.error().what);
      return *ok ? recheck::refuted : recheck::confirmed;
    }
    case accusation_kind::wrong_aggregate: {
      if (!i)
        return recheck::refuted;
      auto rd = result_digest_of(*i);
      if (!rd)
        return recheck::confirmed;
      auto again = recompute_part(*i);
      if (!again)
        return fail(again.error().what);
      if (!*again)
        return recheck::refuted; // a contribution is not on the board: the accuser cannot show it
      return part_digest(step, *i, **again) != *rd ? recheck::confirmed : recheck::refuted;
    }
    case accusation_kind::wrong_projection: {
      if (!i || !r)
        return recheck::refuted;
      auto pairs = pairs_of(*i);
      auto it = pairs.find(x.accused);
      const float* part = contribution(*i, x.accused);
      const float* res = result_values(*i);
      if (it == pairs.end() || !part || !res)
        return recheck::confirmed;
      auto own = project(z[*i].data(), part, res, g.parts[*i].size());
      return projection_matches(it->second, own, norm_of(z[*i].data(), z[*i].size()),
                                check_options().projection_rel_tolerance)
                 ? recheck::refuted
                 : recheck::confirmed;
    }
    case accusation_kind::equivocation:
      return recheck::refuted; // decided from the proof (decide_equivocation)
    }
    return recheck::refuted;
  }

  /// After the markers of phase `p`: proofs, silences and the listed accusations. Returns
  /// whether anyone left the step (then the aggregation is redone).
  result<bool> settle(peer_phase p, const std::set<std::string>& also_silent = {}) {
    std::set<std::string> out;
    for (auto& k : g.members)
      if (board.condemned(k) && !view.ban_reason(k)) {
        view.ban(k, "equivocation proof");
        rec.proofs.push_back(board.proofs().find(k)->second);
        rec.banned.push_back(k);
        out.insert(k);
      }
    for (auto& k : g.members) {
      if (out.count(k) || (marker(k, p) && !also_silent.count(k)))
        continue;
      rec.silent.push_back(k);
      if (view.silent(k, step))
        rec.banned.push_back(k);
      out.insert(k);
    }
    std::vector<accusation_case> cases;
    for (auto* s : listed(p)) {
      auto x = parse_accusation(s->body.payload);
      if (!x)
        continue;
      auto outcome = recheck_of(*x);
      if (!outcome)
        return fail(outcome.error().what);
      cases.push_back({*s, *outcome, std::nullopt});
    }
    if (!cases.empty()) {
      std::set<std::string> banned;
      for (auto& [b, why] : view.banned())
        banned.insert(b);
      auto decided = decide_all(cases, banned);
      for (auto& d : decided) {
        if (!d.decision)
          continue;
        verdict_record vr;
        for (auto& c : cases)
          if (statement_digest(c.accusation) == d.accusation_digest) {
            vr.accusation = c.accusation;
            vr.outcome = c.outcome;
          }
        vr.decision = *d.decision;
        vr.newly_banned = d.newly_banned;
        for (auto& b : d.newly_banned) {
          view.ban(b, d.decision->rule);
          rec.banned.push_back(b);
          out.insert(b);
        }
        rec.verdicts.push_back(std::move(vr));
      }
    }
    std::sort(rec.banned.begin(), rec.banned.end());
    rec.banned.erase(std::unique(rec.banned.begin(), rec.banned.end()), rec.banned.end());
    removed.insert(out.begin(), out.end());
    return !out.empty();
  }

  // -- phases --------------------------------------------------------------------------------
  status start_attempt() {
    rec = attempt_record{};
    rec.attempt = a;
    rec.members = g.members;
    r.reset();
    z.clear();
    round.reset();
    filed.clear();
    phase = peer_phase::commit;
    if (!mine())
      return {};
    if (attacking(protocol_attack::non_finite_part))
      if (auto tg = target())
        sent[g.parts[*tg].begin] = std::numeric_limits<float>::quiet_NaN();
    std::vector<digest> ds;
    for (size_t i = 0; i < n(); ++i)
      ds.push_back(part_digest(step, i, sent.data() + g.parts[i].begin, g.parts[i].size()));
    if (auto st = publish(statement_kind::part_digests, slot(0), digests_payload(ds)); !st)
      return st;
    if (attacking(protocol_attack::equivocate_digest)) {
      // A second digest for part 0, as if stored at other DHT replicas: both are on the board
      // under different keys, and any reader holding both has the proof.
      auto other = ds;
      other[0][0] ^= 1;
      if (auto st = publish(statement_kind::part_digests, slot(0), digests_payload(other)); !st)
        return st;
    }
    auto tg = target();
    // Every part goes on the board, its own part's too: re-checks recompute an aggregate from
    // every contribution to it, the aggregator's own included.
    for (size_t i = 0; i < n(); ++i) {
      if (tg && i == *tg && attacking(protocol_attack::missing_part))
        continue;
      if (tg && i == *tg && attacking(protocol_attack::part_not_committed)) {
        // Other values under the committed digest: readers refuse them (the digest does not
        // match), so for its aggregator the part never arrived.
        std::vector<float> other(sent.data() + g.parts[i].begin,
                                 sent.data() + g.parts[i].begin + g.parts[i].size());
        for (auto& x : other)
          x *= -1.0f;
        data_ref ref{step, a, data_kind::part, i, pk, ds[i]};
        out_data.emplace_back(ref, std::move(other));
        continue;
      }
      if (auto st = publish_data(data_kind::part, i, sent.data() + g.parts[i].begin,
                                 g.parts[i].size(), ds[i]);
          !st)
        return st;
    }
    return mark_done(peer_phase::commit);
  }

  /// Phase 1: check the contributions to this peer's part, then aggregate it.
  status work_aggregate() {
    phase = peer_phase::aggregate;
    auto m = mine();
    if (!m)
      return {};
    auto i = *m;
    auto own_cite = [&](const std::string& k) {
      auto* s = find(statement_kind::part_digests, k, slot(0));
      return s ? std::vector<digest>{statement_digest(*s)} : std::vector<digest>{};
    };
    std::vector<const float*> in;
    for (auto& k : g.members) {
      if (attacking(protocol_attack::leave_one_out) && k == g.members[i == 0 ? 1 : 0])
        continue;
      const float* c = contribution(i, k);
      if (!c) {
        if (auto st = accuse(k, accusation_kind::missing_part, slot(i), own_cite(k)); !st)
          return st;
        continue;
      }
      if (k != pk && !finite_values(c, g.parts[i].size())) {
        if (auto st = accuse(k, accusation_kind::wrong_gradient, slot(i), own_cite(k)); !st)
          return st;
        continue;
      }
      in.push_back(c);
    }
    if (filed.empty()) {
      double tau = attacking(protocol_attack::other_tau) ? o.group.tau / 4 : o.group.tau;
      auto c = centered_clip_fp64(in, g.parts[i].size(), tau, o.group.max_iterations,
                                  o.group.tolerance);
      if (!c)
        return fail(c.error().what);
      note_clip(rec, *c, in.size());
      auto res = std::move(c->value);
      if (attacking(protocol_attack::gross_aggregate))
        for (auto& x : res)
          x += static_cast<float>(o.group.tau);
      if (attacking(protocol_attack::non_finite_result) && !res.empty())
        res[0] = std::numeric_limits<float>::quiet_NaN();
      auto d = part_digest(step, i, res);
      if (auto st = publish(statement_kind::result_digest, slot(i), digest_payload(d)); !st)
        return st;
      if (auto st = publish_data(data_kind::result, i, res.data(), res.size(), d); !st)
        return st;
      if (attacking(protocol_attack::different_results)) {
        // Another result for some receivers: on the board that is a second signed digest for
        // the slot (the data is addressed by digest), which condemns its signer.
        auto other = res;
        for (auto& x : other)
          x *= 0.5f;
        auto d2 = part_digest(step, i, other);
        if (auto st = publish(statement_kind::result_digest, slot(i), digest_payload(d2)); !st)
          return st;
        if (auto st = publish_data(data_kind::result, i, other.data(), other.size(), d2); !st)
          return st;
      }
    }
    return mark_done(peer_phase::aggregate);
  }

  /// Phase 2: check every result, then commit to the MPRNG secret.
  status work_results() {
    phase = peer_phase::results;
    for (size_t i = 0; i < n(); ++i) {
      if (g.members[i] == pk)
        continue;
      auto* rs = find(statement_kind::result_digest, g.members[i], slot(i));
      std::vector<digest> cite;
      if (rs)
        cite.push_back(statement_digest(*rs));
      const float* res = result_values(i);
      if (!res) {
        if (auto st = accuse(g.members[i], accusation_kind::missing_part, slot(i), cite); !st)
          return st;
        continue;
      }
      if (!finite_values(res, g.parts[i].size()))
        if (auto st = accuse(g.members[i], accusation_kind::wrong_aggregate, slot(i), cite); !st)
          return st;
    }
    auto started = mprng_round::start(step, mprng_attempt, g.members);
    if (!started)
      return fail(started.error().what);
    round = std::move(*started);
    ++mprng_attempt;
    rec.mprng_attempt = round->attempt();
    secret = mprng_secret(key, step, round->attempt());
    auto c = mprng_commitment(step, round->attempt(), pk, secret);
    if (auto st = publish(statement_kind::mprng_commit, index_slot(round->attempt(), 0),
                          digest_payload(c));
        !st)
      return st;
    return mark_done(peer_phase::results);
  }

  status work_reveal() {
    phase = peer_phase::reveal;
    for (auto& k : g.members) {
      auto* s = find(statement_kind::mprng_commit, k, index_slot(round->attempt(), 0));
      if (!s)
        continue;
      auto d = digest_of_string(s->body.payload);
      if (d)
        (void)round->add_commit(k, *d);
    }
    round->close_commits();
    if (!attacking(protocol_attack::withhold_reveal))
      if (auto st = publish(statement_kind::mprng_reveal, index_slot(round->attempt(), 0),
                            digest_payload(secret));
          !st)
        return st;
    return mark_done(peer_phase::reveal);
  }

  status work_project() {
    phase = peer_phase::project;
    z.clear();
    std::vector<std::pair<double, double>> mine_pairs;
    for (size_t i = 0; i < n(); ++i) {
      z.push_back(gaussian_direction(direction_seed(*r, i), g.parts[i].size()));
      const float* res = result_values(i);
      if (!res)
        return fail(fmt::format("step {}: the result of part {} is gone", step, i));
      auto pr = project(z[i].data(), sent.data() + g.parts[i].begin, res, g.parts[i].size());
      if (attacking(protocol_attack::lie_projection) && target() && i == *target())
        pr.s = pr.s * 1.01 + 1e-3 * pr.n;
      mine_pairs.emplace_back(pr.s, pr.n);
    }
    if (auto st = publish(statement_kind::projections, slot(0), projections_payload(mine_pairs));
        !st)
      return st;
    return mark_done(peer_phase::project);
  }

  status work_check() {
    phase = peer_phase::check;
    auto m = mine();
    auto co = check_options();
    auto cite_of = [&](statement_kind kind, const std::string& k, const std::string& s) {
      auto* st = find(kind, k, s);
      return st ? std::vector<digest>{statement_digest(*st)} : std::vector<digest>{};
    };
    auto pair_cites = [&](const std::string& k) {
      auto c = cite_of(statement_kind::projections, k, slot(0));
      for (auto& d : cite_of(statement_kind::part_digests, k, slot(0)))
        c.push_back(d);
      return c;
    };
    std::set<std::string> accused_projection;
    auto pair_true = [&](const std::string& k, size_t i) -> std::optional<projection> {
      const float* part = contribution(i, k);
      const float* res = result_values(i);
      if (!part || !res)
        return std::nullopt;
      return project(z[i].data(), part, res, g.parts[i].size());
    };
    if (m) {
      auto i = *m;
      auto pairs = pairs_of(i);
      double zn = norm_of(z[i].data(), z[i].size());
      for (auto& k : g.members) {
        if (k == pk)
          continue;
        auto own = pair_true(k, i);
        auto it = pairs.find(k);
        if (own && it != pairs.end() &&
            projection_matches(it->second, *own, zn, co.projection_rel_tolerance))
          continue;
        if (auto st = accuse(k, accusation_kind::wrong_projection, slot(i), pair_cites(k)); !st)
          return st;
        accused_projection.insert(k);
      }
    }
    for (size_t i = 0; i < n(); ++i) {
      auto checked = check_part(i);
      if (!checked)
        return fail(fmt::format("step {}: part {} cannot be checked (pairs or result missing)",
                                step, i));
      const float* res = result_values(i);
      rec.checks.push_back({i, norm_of(res, g.parts[i].size()), checked->residual,
                            checked->bound, checked->accepted});
      if (checked->accepted)
        continue;
      auto again = recompute_part(i);
      if (!again)
        return fail(again.error().what);
      auto rd = result_digest_of(i);
      if (!*again || !rd || part_digest(step, i, **again) != *rd) {
        if (g.members[i] == pk)
          continue; // its own aggregate: the others accuse it
        if (auto st = accuse(g.members[i], accusation_kind::wrong_aggregate, slot(i),
                             cite_of(statement_kind::result_digest, g.members[i], slot(i)));
            !st)
          return st;
        continue;
      }
      bool blamed = false;
      auto pairs = pairs_of(i);
      double zn = norm_of(z[i].data(), z[i].size());
      for (auto& k : g.members) {
        if (m && *m == i && accused_projection.count(k)) {
          blamed = true;
          continue;
        }
        auto own = pair_true(k, i);
        auto it = pairs.find(k);
        if (own && it != pairs.end() &&
            projection_matches(it->second, *own, zn, co.projection_rel_tolerance))
          continue;
        blamed = true;
        if (k == pk)
          continue; // its own pair is what it computed; it does not accuse itself
        if (auto st = accuse(k, accusation_kind::wrong_projection, slot(i), pair_cites(k)); !st)
          return st;
      }
      if (!blamed)
        rec.checks.back().recomputed = true;
    }
    rec.validations = validations();
    for (auto& v : rec.validations) {
      // An attacker does not report its fellows (the lockstep group's attackers do not either).
      if (v.validator != pk || byzantine())
        continue;
      auto ok = gradient_ok(v.target);
      if (!ok)
        return fail(ok.error().what);
      if (!*ok)
        if (auto st = accuse(v.target, accusation_kind::wrong_gradient, slot(0),
                             cite_of(statement_kind::part_digests, v.target, slot(0)));
            !st)
          return st;
    }
    if (attacking(protocol_attack::false_accusation))
      if (auto tg = target())
        if (auto st = accuse(g.members[*tg], accusation_kind::wrong_gradient, slot(0),
                             cite_of(statement_kind::part_digests, g.members[*tg], slot(0)));
            !st)
          return st;
    return mark_done(peer_phase::check);
  }

  // -- step ends -----------------------------------------------------------------------------
  void end_step(bool applied) {
    record.applied = applied;
    if (applied) {
      for (size_t i = 0; i < n(); ++i)
        nesterov_step(params, velocity, g.parts[i].begin, result_values(i), g.parts[i].size(),
                      o.group.lr, o.group.momentum);
      record.contributors = n();
      r_prev = *r;
    } else if (!record.attempts.empty() && record.attempts.back().r) {
      r_prev = *record.attempts.back().r; // as the lockstep group does
    } else {
      r_prev = skipped_randomness(r_prev);
    }
    record.params[pk] = params_digest(params);
    record.ms_apply = 0.0;
    board.forget_before(step + 1);
    by_digest.clear();
    logged.clear();
    later.clear();
    data.clear();
    recomputed.clear();
    finished = std::move(record);
    record = step_record{};
    ++step;
    phase = view.ban_reason(pk) ? peer_phase::banned : peer_phase::idle;
  }

  /// The attempt's record takes every statement of the step read or published since the last
  /// attempt's (in digest order): what an audit of this peer's log re-checks.
  void log_board() {
    rec.statements.clear();
    for (auto& [d, st] : by_digest)
      if (logged.insert(d).second)
        rec.statements.push_back(st);
  }

  /// The attempt ended with removals: the next one without them, or the step's end.
  status redo() {
    log_board();
    record.attempts.push_back(std::move(rec));
    if (view.ban_reason(pk) || removed.count(pk)) {
      // Banned, or removed for the step (its own view says it was silent): it sits it out.
      end_step(false);
      return {};
    }
    if (a + 1 >= o.group.max_attempts) {
      end_step(false);
      return {};
    }
    auto again = view.regroup(g, removed, t->dim());
    if (!again) {
      end_step(false);
      return {};
    }
    g = *again;
    ++a;
    return start_attempt();
  }

  /// After a wait's decisions: a redo when anyone left (true when that ended the step),
  /// else the next phase's work (false).
  result<bool> next(result<bool> left, status (impl::*work)()) {
    if (!left)
      return fail(left.error().what);
    if (*left) {
      if (auto st = redo(); !st)
        return fail(st.what());
      return phase == peer_phase::idle || phase == peer_phase::banned;
    }
    if (auto st = (this->*work)(); !st)
      return fail(st.what());
    return false;
  }

  result<bool> advance() {
    if (phase == peer_phase::idle || phase == peer_phase::banned)
      return fail("no step is running");
    auto done = [&]() -> result<bool> { return phase == peer_phase::idle ||
                                               phase == peer_phase::banned; };
    switch (phase) {
    case peer_phase::commit: {
      std::set<std::string> no_digests;
      for (auto& k : g.members)
        if (committed(k).empty())
          no_digests.insert(k);
      return next(settle(peer_phase::commit, no_digests), &impl::work_aggregate);
    }
    case peer_phase::aggregate: {
      bool accusations = !listed(peer_phase::aggregate).empty();
      std::set<std::string> no_result;
      if (!accusations)
        for (size_t i = 0; i < n(); ++i)
          if (!result_digest_of(i))
            no_result.insert(g.members[i]);
      return next(settle(peer_phase::aggregate, no_result), &impl::work_results);
    }
    case peer_phase::results: {
      std::set<std::string> no_commit;
      for (auto& k : g.members)
        if (!find(statement_kind::mprng_commit, k, index_slot(round->attempt(), 0)))
          no_commit.insert(k);
      return next(settle(peer_phase::results, no_commit), &impl::work_reveal);
    }
    case peer_phase::reveal: {
      for (auto& k : g.members) {
        auto* s = find(statement_kind::mprng_reveal, k, index_slot(round->attempt(), 0));
        if (!s)
          continue;
        auto d = digest_of_string(s->body.payload);
        if (d)
          (void)round->add_reveal(k, *d);
      }
      auto drawn = round->finish();
      auto left = settle(peer_phase::reveal);
      if (!left)
        return fail(left.error().what);
      if (!drawn.withholders.empty() || !drawn.value) {
        for (auto& k : drawn.withholders) {
          if (view.ban(k, "withheld its MPRNG reveal"))
            rec.banned.push_back(k);
          removed.insert(k);
        }
        for (auto& k : drawn.silent)
          removed.insert(k);
        *left = true;
      }
      if (!*left) {
        r = *drawn.value;
        rec.r = r;
      }
      return next(left, &impl::work_project);
    }
    case peer_phase::project: {
      std::set<std::string> no_pairs;
      for (auto& k : g.members)
        if (!find(statement_kind::projections, k, slot(0)))
          no_pairs.insert(k);
      return next(settle(peer_phase::project, no_pairs), &impl::work_check);
    }
    case peer_phase::check: {
      auto left = settle(peer_phase::check);
      if (!left)
        return fail(left.error().what);
      if (*left) {
        if (auto st = redo(); !st)
          return fail(st.what());
        return done();
      }
      for (auto& c : rec.checks)
        if (!c.accepted && !c.recomputed)
          return fail(fmt::format("step {}: part {}'s aggregate failed the check and nobody was "
                                  "found to blame (residual {:.3g} > bound {:.3g})",
                                  step, c.part, c.residual, c.bound));
      rec.applied = true;
      log_board();
      record.attempts.push_back(std::move(rec));
      end_step(true);
      return true;
    }
    default:
      return fail("no step is running");
    }
  }

  status begin_step() {
    if (phase != peer_phase::idle)
      return fail(fmt::format("begin_step in phase {}", phase_name(phase)));
    record = step_record{};
    record.step = step;
    record.r_prev = r_prev;
    finished.reset();
    removed.clear();
    mprng_attempt = 0;
    a = 0;
    view_at_start = view.encode();
    // Cooled-down peers are back (in every view alike: the membership rules are public).
    coming_back.clear();
    for (auto& k : everyone)
      if (view.absent(k, step) == absence::not_joined) {
        (void)view.join(k, step);
        coming_back.insert(k);
      }
    auto grouped = view.group(step, t->dim());
    if (!grouped) {
      end_step(false);
      return {};
    }
    g = *grouped;
    seeds.clear();
    for (auto& k : g.members)
      seeds[k] = batch_seed(r_prev, k);
    record.seeds = seeds;
    if (!g.index_of(pk)) {
      // Cooling down: it waits out the step (it would download the state to come back).
      end_step(false);
      return {};
    }
    theta_at_step = params;
    auto t0 = std::chrono::steady_clock::now();
    auto gr = t->gradient(params, seeds.at(pk), false);
    record.ms_gradients =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!gr)
      return fail(gr.error().what);
    truth = std::move(*gr);
    auto attacked = attack(truth);
    if (!attacked)
      return fail(attacked.error().what);
    sent = std::move(*attacked);
    if (sent.size() != t->dim())
      return fail("an attack produced a vector of the wrong size");
    return start_attempt();
  }

  result<std::vector<float>> attack(const std::vector<float>& g_true) {
    auto& x = o.gradient;
    if (x.kind == attack_kind::delayed && delayed)
      delayed->record(step, as_tensor(g_true).clone());
    if (x.kind == attack_kind::none || !attacks_at(x, step))
      return g_true;
    switch (x.kind) {
    case attack_kind::sign_flip:
      return as_vector(sign_flip(as_tensor(g_true), x.scale));
    case attack_kind::random_direction: {
      auto out = direction->apply({as_tensor(g_true)}, x.scale);
      if (!out)
        return fail(out.error().what);
      return as_vector(out->front());
    }
    case attack_kind::label_flip:
      return t->gradient(params, seeds.at(pk), true);
    case attack_kind::delayed: {
      auto old = delayed->replay(step);
      return old ? as_vector(*old) : g_true;
    }
    case attack_kind::ipm:
    case attack_kind::alie: {
      // The honest statistics from every honest member's gradient, recomputed from the public
      // seeds at the parameters every peer holds.
      std::vector<at::Tensor> honest;
      size_t byz = 0;
      for (auto& k : g.members) {
        if (o.colluders.count(k)) {
          ++byz;
          continue;
        }
        auto tg = true_gradient(k);
        if (!tg)
          return fail(tg.error().what);
        honest.push_back(as_tensor(**tg).clone());
      }
      auto stats = statistics_of(honest);
      if (!stats)
        return fail(stats.error().what);
      if (x.kind == attack_kind::ipm)
        return as_vector(ipm(*stats, x.epsilon));
      auto z = alie_z(g.members.size(), byz);
      if (!z)
        return fail(z.error().what);
      return as_vector(alie(*stats, *z));
    }
    default:
      return g_true;
    }
  }

  void offer(const signed_statement& s) {
    if (s.body.kind == statement_kind::state_digest)
      return; // offered to a peer coming back, never part of a step
    if (s.body.run_id != o.group.run_id || s.body.step != step ||
        phase == peer_phase::idle || phase == peer_phase::banned) {
      return; // another run's, or not this step's: nothing to do with it now
    }
    if (view.ban_reason(s.body.signer)) {
      ++refused;
      ++record.refused_statements;
      return;
    }
    auto d = statement_digest(s);
    if (by_digest.count(d))
      return;
    auto added = board.add(s);
    if (!added) {
      ++refused;
      return;
    }
    by_digest.emplace(d, s);
    // A member already in a later aggregation of this step: the others removed someone this
    // peer still waits for (or this peer itself).
    if (s.body.kind == statement_kind::phase_done)
      if (auto at = parse_index_slot(s.body.slot); at && at->first > a)
        later[at->first].insert(s.body.signer);
  }

  bool only_coming_back_missing() const {
    if (phase != peer_phase::commit || a != 0)
      return false;
    bool any = false;
    for (auto& k : g.members)
      if (!marker(k, phase)) {
        if (!coming_back.count(k))
          return false;
        any = true;
      }
    return any;
  }

  bool majority_ahead() const {
    if (phase == peer_phase::idle || phase == peer_phase::banned)
      return false;
    size_t ahead = 0;
    for (auto& k : g.members) {
      if (k == pk)
        continue;
      for (int q = static_cast<int>(phase) + 1; q <= static_cast<int>(peer_phase::check); ++q)
        if (marker(k, static_cast<peer_phase>(q))) {
          ++ahead;
          break;
        }
    }
    return 2 * ahead > n();
  }

  /// Whether most of the group went on to a later aggregation of this step without this peer's
  /// view following: its view of who was silent differs from theirs.
  bool behind() const {
    if (phase == peer_phase::idle || phase == peer_phase::banned)
      return false;
    for (auto& [att, who] : later)
      if (att > a && 2 * who.size() > n())
        return true;
    return false;
  }

  void offer(const data_ref& ref, const std::vector<float>& values) {
    if (ref.step != step || ref.attempt != a || datum(ref))
      return;
    if (view.ban_reason(ref.sender)) {
      ++refused;
      ++record.refused_parts;
      return;
    }
    auto w = wanted();
    if (!std::binary_search(w.begin(), w.end(), ref))
      return;
    if (ref.part >= n() || values.size() != g.parts[ref.part].size() ||
        part_digest(step, ref.part, values) != ref.committed) {
      ++refused;
      return;
    }
    rec.bytes_data += values.size() * sizeof(float);
    data[ref] = values;
  }
};

namespace {

constexpr std::string_view state_tag = "starling.btard.state.v1";

void put_floats(std::string& out, const std::vector<float>& v) {
  detail::put_u64(out, v.size());
  auto at = out.size();
  out.resize(at + v.size() * sizeof(float));
  if (!v.empty())
    std::memcpy(&out[at], v.data(), v.size() * sizeof(float));
}

bool read_floats(detail::reader& in, std::vector<float>& v, uint64_t expected) {
  uint64_t n = 0;
  std::string raw;
  if (!in.le(n, 8) || n != expected || !in.raw(raw, n * sizeof(float)))
    return false;
  v.resize(n);
  if (n > 0)
    std::memcpy(v.data(), raw.data(), raw.size());
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

} // namespace

digest state_digest_of(std::string_view state) { return hash_bytes(state); }

uint64_t state_step(std::string_view state) {
  if (state.substr(0, state_tag.size()) != state_tag)
    return 0;
  detail::reader in(state.substr(state_tag.size()));
  uint64_t len = 0, step = 0;
  std::string run;
  if (!in.le(len, 8) || len > max_run_id_bytes || !in.raw(run, len) || !in.le(step, 8))
    return 0;
  return step;
}

std::string peer_core::export_state() const {
  auto& p = *p_;
  std::string out(state_tag);
  detail::put_u64(out, p.o.group.run_id.size());
  out += p.o.group.run_id;
  detail::put_u64(out, p.step);
  detail::put_f64(out, p.o.group.tau);
  out += digest_string(p.r_prev);
  put_floats(out, p.params);
  put_floats(out, p.velocity);
  out += p.phase == peer_phase::idle || p.phase == peer_phase::banned ? p.view.encode()
                                                                      : p.view_at_start;
  return out;
}

std::vector<std::string> peer_core::expected() const {
  std::vector<std::string> out;
  for (auto& k : p_->everyone) {
    auto a = p_->view.absent(k, p_->step);
    if (a == absence::none || a == absence::not_joined)
      out.push_back(k);
  }
  return out;
}

std::vector<std::string> peer_core::active() const {
  std::vector<std::string> out;
  for (auto& k : p_->everyone)
    if (p_->view.absent(k, p_->step) == absence::none)
      out.push_back(k);
  return out;
}

result<std::unique_ptr<peer_core>> peer_core::resume(const peer_core_options& o,
                                                     std::shared_ptr<const task> t,
                                                     auth::key_pair key,
                                                     std::vector<std::string> members,
                                                     std::string_view state) {
  if (state.substr(0, state_tag.size()) != state_tag)
    return fail("not a BTARD peer state (wrong tag)");
  detail::reader in(state.substr(state_tag.size()));
  uint64_t len = 0, step = 0;
  std::string run, r;
  double tau = 0;
  if (!in.le(len, 8) || len > max_run_id_bytes || !in.raw(run, len) || !in.le(step, 8) ||
      !in.f64(tau) || !in.raw(r, digest_bytes))
    return fail("a BTARD peer state is truncated in its header");
  if (run != o.group.run_id)
    return fail(fmt::format("the state is run '{}''s, not '{}''s", run, o.group.run_id));
  if (!(tau > 0) || !std::isfinite(tau))
    return fail(fmt::format("the state's tau {} is not a positive number", tau));
  auto with_tau = o;
  with_tau.group.tau = tau;
  auto made = make(with_tau, std::move(t), std::move(key), std::move(members));
  if (!made)
    return made;
  auto& p = *(*made)->p_;
  if (!read_floats(in, p.params, p.t->dim()) || !read_floats(in, p.velocity, p.t->dim()))
    return fail(fmt::format("the state's parameters or momentum are not {} finite values",
                            p.t->dim()));
  std::string rest;
  (void)in.raw(rest, in.left());
  auto view = membership::decode(rest, o.group.membership);
  if (!view)
    return fail(view.error().what);
  if (auto why = view->ban_reason(p.pk))
    return fail(fmt::format("the state says this peer is banned ({})", *why));
  p.view = std::move(*view);
  p.step = step;
  p.r_prev = *digest_of_string(r);
  return made;
}

peer_core::peer_core(std::unique_ptr<impl> p) : p_(std::move(p)) {}
peer_core::~peer_core() = default;

result<std::unique_ptr<peer_core>> peer_core::make(const peer_core_options& o,
                                                   std::shared_ptr<const task> t,
                                                   auth::key_pair key,
                                                   std::vector<std::string> members) {
  if (auto st = validate(o); !st)
    return fail(st.what());
  if (!t)
    return fail("no task");
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  if (members.size() < 2)
    return fail("a group needs at least 2 peers");
  auto p = std::make_unique<impl>(o, std::move(t), std::move(key));
  if (!std::binary_search(members.begin(), members.end(), p->pk))
    return fail("the peer's own key is not among the members");
  p->everyone = members;
  p->r_prev = initial_randomness(o.group.run_id, o.group.seed);
  p->params = p->t->initial();
  if (p->params.size() != p->t->dim())
    return fail("the task's initial parameters have the wrong size");
  p->velocity.assign(p->params.size(), 0.0f);
  for (auto& k : members)
    if (auto st = p->view.join(k, 0); !st)
      return fail(st.what());
  if (o.gradient.kind == attack_kind::delayed)
    p->delayed = std::make_unique<delayed_gradients>(o.gradient);
  if (o.gradient.kind == attack_kind::random_direction)
    p->direction = std::make_unique<random_direction_attack>(
        o.gradient.direction_seed, std::vector<std::vector<int64_t>>{{int64_t(p->t->dim())}});
  return std::unique_ptr<peer_core>(new peer_core(std::move(p)));
}

status peer_core::begin_step() {
  torch::NoGradGuard off;
  return p_->begin_step();
}
std::vector<signed_statement> peer_core::take_statements() {
  return std::exchange(p_->out_statements, {});
}
std::vector<std::pair<data_ref, std::vector<float>>> peer_core::take_data() {
  return std::exchange(p_->out_data, {});
}
void peer_core::offer(const signed_statement& s) { p_->offer(s); }
void peer_core::offer(const data_ref& ref, const std::vector<float>& values) {
  p_->offer(ref, values);
}
std::vector<data_ref> peer_core::wanted() const { return p_->wanted(); }
bool peer_core::ready() const { return p_->ready(); }
result<bool> peer_core::advance() {
  torch::NoGradGuard off;
  return p_->advance();
}
step_record peer_core::take_record() {
  auto r = p_->finished ? std::move(*p_->finished) : step_record{};
  p_->finished.reset();
  return r;
}
peer_phase peer_core::phase() const { return p_->phase; }
uint64_t peer_core::step() const { return p_->step; }
uint32_t peer_core::attempt() const { return p_->a; }
const step_group& peer_core::group() const { return p_->g; }
const std::string& peer_core::key() const { return p_->pk; }
const std::vector<float>& peer_core::params() const { return p_->params; }
const std::map<std::string, std::string>& peer_core::bans() const { return p_->view.banned(); }
const digest& peer_core::randomness() const { return p_->r_prev; }
double peer_core::tau() const { return p_->o.group.tau; }
uint64_t peer_core::refused() const { return p_->refused; }
bool peer_core::behind() const { return p_->behind(); }
bool peer_core::majority_ahead() const { return p_->majority_ahead(); }
bool peer_core::only_coming_back_missing() const { return p_->only_coming_back_missing(); }
bool peer_core::cooling_down() const {
  return p_->view.absent(p_->pk, p_->step) == absence::cooling_down;
}

} // namespace starling::actors::btard
