#include "runtime/btard/audit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/auth/identity.hpp"
#include "actors/btard/aggregate_check.hpp"
#include "actors/btard/commitment.hpp"
#include "actors/btard/digest.hpp"
#include "actors/btard/membership.hpp"
#include "actors/btard/protocol.hpp"
#include "actors/btard/mprng.hpp"
#include "actors/btard/task.hpp"
#include "actors/btard/verdict.hpp"
#include "kernels/data/idx_source.hpp"

namespace starling::runtime::btard {

namespace bt = starling::actors::btard;
using json = nlohmann::json;
using actors::auth::from_hex;
using actors::auth::to_hex;

namespace {

constexpr const char* format_name = "starling.btard.audit.v1";

std::string hex(const bt::digest& d) {
  return bt::digest_hex(d);
}

std::string line_hash(const std::string& line) {
  return hex(bt::hash_bytes(line));
}

json statement_json(const bt::signed_statement& s) {
  return to_hex(bt::encode(s));
}

} // namespace

std::string checkpoint_dir(const std::string& audit_path) {
  auto slash = audit_path.find_last_of('/');
  return (slash == std::string::npos ? std::string(".") : audit_path.substr(0, slash))
         + "/btard-checkpoints";
}

result<audit_writer> audit_writer::open(const std::string& path, const audit_header& h) {
  audit_writer w;
  w.path_ = path;
  w.out_.open(path, std::ios::trunc);
  if (!w.out_)
    return fail(fmt::format("cannot write {}", path));
  json j;
  j["kind"] = "header";
  j["format"] = format_name;
  j["run_id"] = h.run_id;
  j["seed"] = h.seed;
  j["dim"] = h.dim;
  json peers = json::array();
  for (auto& k : h.peers)
    peers.push_back(to_hex(k));
  j["peers"] = peers;
  auto& o = h;
  j["options"] = {{"rule", o.rule},
                  {"tau", o.tau},
                  {"iterations", o.iterations},
                  {"tolerance", o.tolerance},
                  {"validators", o.validators},
                  {"sigmas", o.sigmas},
                  {"validation_rel_tolerance", o.validation_rel_tolerance},
                  {"lr", o.lr},
                  {"momentum", o.momentum}};
  j["task"] = {{"model", "mlp"},
               {"hidden", h.hidden},
               {"batch", h.batch},
               {"seed", h.model_seed},
               {"data_dir", h.data_dir},
               {"synthetic", h.synthetic_when_absent},
               {"train_samples", h.train_samples}};
  j["r0"] = hex(bt::initial_randomness(h.run_id, h.seed));
  if (h.r_resumed.size() == bt::digest_bytes) {
    j["resumed_at"] = h.resumed_at;
    j["r_resumed"] = to_hex(h.r_resumed);
  }
  j["prev"] = "";
  if (auto st = w.line(j.dump()); !st)
    return fail(st.what());
  return w;
}

status audit_writer::line(const std::string& text) {
  out_ << text << '\n';
  out_.flush();
  if (!out_)
    return fail(fmt::format("writing {} failed", path_));
  prev_ = line_hash(text);
  ++lines_;
  return {};
}

status audit_writer::write(const bt::step_record& rec) {
  json j;
  j["kind"] = "step";
  j["step"] = rec.step;
  j["r_prev"] = hex(rec.r_prev);
  json seeds = json::object();
  for (auto& [k, s] : rec.seeds)
    seeds[to_hex(k)] = s;
  j["seeds"] = seeds;
  json attempts = json::array();
  for (auto& a : rec.attempts) {
    json x;
    x["attempt"] = a.attempt;
    json members = json::array();
    for (auto& k : a.members)
      members.push_back(to_hex(k));
    x["members"] = members;
    json statements = json::array();
    for (auto& s : a.statements)
      statements.push_back(statement_json(s));
    x["statements"] = statements;
    json proofs = json::array();
    for (auto& p : a.proofs)
      proofs.push_back({statement_json(p.first), statement_json(p.second)});
    x["proofs"] = proofs;
    x["mprng_attempt"] = a.mprng_attempt;
    if (a.r)
      x["r"] = hex(*a.r);
    json vals = json::array();
    for (auto& v : a.validations)
      vals.push_back({to_hex(v.validator), to_hex(v.target)});
    x["validations"] = vals;
    json checks = json::array();
    for (auto& c : a.checks)
      checks.push_back({{"part", c.part},
                        {"aggregate_norm", c.aggregate_norm},
                        {"residual", c.residual},
                        {"bound", c.bound},
                        {"accepted", c.accepted},
                        {"recomputed", c.recomputed}});
    x["checks"] = checks;
    json verdicts = json::array();
    for (auto& v : a.verdicts) {
      json y;
      y["accusation"] = statement_json(v.accusation);
      y["outcome"] = bt::recheck_name(v.outcome);
      if (v.proof)
        y["proof"] = {statement_json(v.proof->first), statement_json(v.proof->second)};
      y["action"] = bt::verdict_action_name(v.decision.action);
      json banned = json::array();
      for (auto& k : v.decision.banned)
        banned.push_back(to_hex(k));
      y["banned"] = banned;
      y["rule"] = v.decision.rule;
      verdicts.push_back(y);
    }
    x["verdicts"] = verdicts;
    json silent = json::array(), banned = json::array();
    for (auto& k : a.silent)
      silent.push_back(to_hex(k));
    for (auto& k : a.banned)
      banned.push_back(to_hex(k));
    x["silent"] = silent;
    x["banned"] = banned;
    x["applied"] = a.applied;
    x["clipped"] = a.clipped;
    x["inputs"] = a.inputs;
    attempts.push_back(x);
  }
  j["attempts"] = attempts;
  json params = json::object();
  for (auto& [k, d] : rec.params)
    params[to_hex(k)] = hex(d);
  j["params"] = params;
  j["applied"] = rec.applied;
  j["prev"] = prev_;
  return line(j.dump());
}

// --- the checker ---------------------------------------------------------------------------------

namespace {

struct checker {
  audit_report report;
  audit_header h;
  bt::digest r_expected{};
  size_t line_no = 0;
  bool recompute = false;
  std::string dir;
  std::shared_ptr<const bt::task> task;
  /// Parameter digests the log gives after the step before (θ_t of the current step).
  std::set<bt::digest> theta_digests;
  std::map<std::string, uint64_t> seeds;

  void problem(const std::string& what) {
    report.problems.push_back(fmt::format("line {}: {}", line_no, what));
  }

  std::optional<std::string> key_of(const json& v) {
    if (!v.is_string()) {
      problem("a key is not a string");
      return std::nullopt;
    }
    auto k = from_hex(v.get<std::string>());
    if (!k || k->size() != 32) {
      problem(fmt::format("'{}' is not a 32-byte hex key", v.get<std::string>()));
      return std::nullopt;
    }
    return *k;
  }

  std::optional<bt::digest> digest_of(const json& v) {
    if (!v.is_string())
      return std::nullopt;
    auto b = from_hex(v.get<std::string>());
    if (!b)
      return std::nullopt;
    auto d = bt::digest_of_string(*b);
    if (!d)
      return std::nullopt;
    return *d;
  }

  std::optional<bt::signed_statement> statement_of(const json& v, uint64_t step) {
    if (!v.is_string()) {
      problem("a statement is not a hex string");
      return std::nullopt;
    }
    auto b = from_hex(v.get<std::string>());
    if (!b) {
      problem("a statement is not hex");
      return std::nullopt;
    }
    auto s = bt::decode(*b);
    if (!s) {
      problem(fmt::format("a statement does not decode: {}", s.error().what));
      return std::nullopt;
    }
    if (!bt::verify(*s)) {
      problem(fmt::format("the {} statement of {} does not verify", bt::kind_name(s->body.kind),
                          to_hex(s->body.signer).substr(0, 12)));
      return std::nullopt;
    }
    if (s->body.run_id != h.run_id || s->body.step != step) {
      problem(fmt::format("a {} statement of run '{}' step {} in run '{}' step {}",
                          bt::kind_name(s->body.kind), s->body.run_id, s->body.step, h.run_id,
                          step));
      return std::nullopt;
    }
    ++report.statements;
    return *s;
  }

  void header(const json& j) {
    if (j.value("kind", "") != "header" || j.value("format", "") != format_name) {
      problem(fmt::format("not a {} header", format_name));
      return;
    }
    h.run_id = j.value("run_id", "");
    h.seed = j.value("seed", uint64_t{0});
    h.dim = j.value("dim", uint64_t{0});
    auto& o = j.at("options");
    h.tau = o.at("tau").get<double>();
    h.tolerance = o.at("tolerance").get<double>();
    h.sigmas = o.at("sigmas").get<double>();
    h.validators = o.at("validators").get<size_t>();
    r_expected = bt::initial_randomness(h.run_id, h.seed);
    if (j.value("r0", "") != hex(r_expected))
      problem("r0 is not the run's initial randomness");
    if (j.contains("resumed_at")) {
      // A peer that came back: its chain starts from the state it took.
      auto r = j.contains("r_resumed") ? digest_of(j.at("r_resumed")) : std::nullopt;
      if (!j.at("resumed_at").is_number_unsigned() || !r)
        problem("resumed_at or r_resumed is malformed");
      else {
        report.resumed_at = j.at("resumed_at").get<uint64_t>();
        r_expected = *r;
      }
    }
    if (!recompute)
      return;
    if (!j.contains("task")) {
      problem("--recompute: the header names no task");
      return;
    }
    auto& tj = j.at("task");
    kernels::idx_source_options io;
    io.dir = tj.at("data_dir").get<std::string>();
    io.synthetic_when_absent = tj.at("synthetic").get<bool>();
    io.synthetic_seed = h.seed;
    io.max_items = tj.at("train_samples").get<uint64_t>();
    auto train = kernels::idx_source::load(io);
    if (!train)
      throw std::runtime_error("--recompute: " + train.error().what);
    bt::mlp_task_options mo;
    mo.hidden = tj.at("hidden").get<int64_t>();
    mo.batch = tj.at("batch").get<uint64_t>();
    mo.seed = tj.at("seed").get<uint64_t>();
    auto t = bt::make_mlp_task(*train, nullptr, mo);
    if (!t)
      throw std::runtime_error("--recompute: " + t.error().what);
    task = *t;
    if (task->dim() != h.dim)
      throw std::runtime_error(fmt::format("--recompute: the task has {} parameters, the log {}",
                                           task->dim(), h.dim));
    theta_digests = {bt::params_digest(task->initial())};
  }

  /// The re-check of a wrong-gradient accusation, recomputed: confirmed when the accused's
  /// signed part digests differ from those of its recomputed gradient, or when that gradient is
  /// not finite (no part may be).
  std::optional<bt::recheck> recompute_gradient(uint64_t t, uint32_t attempt,
                                                const std::vector<std::string>& members,
                                                const std::string& accused,
                                                const std::map<std::string, std::vector<bt::digest>>& committed) {
    auto path = fmt::format("{}/step-{}.params", dir, t);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      problem(fmt::format("--recompute: no parameter checkpoint {}", path));
      return std::nullopt;
    }
    std::vector<float> theta(task->dim());
    in.read(reinterpret_cast<char*>(theta.data()),
            static_cast<std::streamsize>(theta.size() * sizeof(float)));
    if (!in || in.peek() != EOF) {
      problem(fmt::format("--recompute: {} does not hold {} float32 values", path, theta.size()));
      return std::nullopt;
    }
    if (!theta_digests.count(bt::params_digest(theta))) {
      problem(fmt::format("--recompute: {} is not the parameters the log gives for step {}", path, t));
      return std::nullopt;
    }
    auto seed = seeds.find(accused);
    auto mine = committed.find(accused);
    if (seed == seeds.end() || mine == committed.end()) {
      problem("--recompute: the accused has no seed or no part digests in its step");
      return std::nullopt;
    }
    auto g = task->gradient(theta, seed->second, false);
    auto parts = bt::equal_parts(h.dim, members.size());
    if (!g || !parts || parts->size() != mine->second.size()) {
      problem("--recompute: the gradient or the parts cannot be recomputed");
      return std::nullopt;
    }
    ++report.recomputed;
    (void)attempt;
    // A non-finite gradient is wrong by the protocol's rule, whatever its digests say.
    for (float x : *g)
      if (!std::isfinite(x))
        return bt::recheck::confirmed;
    for (size_t i = 0; i < parts->size(); ++i)
      if (bt::part_digest(t, i, g->data() + (*parts)[i].begin, (*parts)[i].size())
          != mine->second[i])
        return bt::recheck::confirmed;
    return bt::recheck::refuted;
  }

  void step(const json& j) {
    auto t = j.at("step").get<uint64_t>();
    auto expected = report.steps + report.resumed_at.value_or(0);
    if (t != expected)
      problem(fmt::format("step {} where step {} was expected", t, expected));
    ++report.steps;
    auto r_prev = digest_of(j.at("r_prev"));
    if (!r_prev || *r_prev != r_expected)
      problem("r_prev is not the randomness the step before drew");
    seeds.clear();
    for (auto& [kh, seed] : j.at("seeds").items()) {
      auto k = from_hex(kh);
      if (!k || !r_prev)
        continue;
      seeds[*k] = seed.get<uint64_t>();
      if (seed.get<uint64_t>() != bt::batch_seed(*r_prev, *k))
        problem(fmt::format("the batch seed of {} is not batch_seed(r_prev, key)", kh.substr(0, 12)));
    }
    std::optional<bt::digest> last_r;
    for (auto& a : j.at("attempts")) {
      ++report.attempts;
      last_r = attempt(t, a);
    }
    r_expected = last_r ? *last_r : bt::skipped_randomness(r_expected);
    if (recompute && j.contains("params")) {
      theta_digests.clear();
      for (auto& [kh, dh] : j.at("params").items())
        if (auto d = digest_of(dh))
          theta_digests.insert(*d);
    }
  }

  std::optional<bt::digest> attempt(uint64_t t, const json& a) {
    std::vector<std::string> members;
    for (auto& m : a.at("members"))
      if (auto k = key_of(m))
        members.push_back(*k);
    if (!std::is_sorted(members.begin(), members.end()))
      problem("the group is not in key order");
    std::map<std::string, bt::digest> commits, reveals;
    std::map<std::string, std::vector<std::pair<double, double>>> projections;
    std::map<std::string, std::vector<bt::digest>> committed;
    auto mprng_slot = bt::index_slot(a.at("mprng_attempt").get<uint32_t>(), 0);
    auto own_slot = bt::index_slot(a.at("attempt").get<uint32_t>(), 0);
    for (auto& sv : a.at("statements")) {
      auto s = statement_of(sv, t);
      if (!s)
        continue;
      if (s->body.kind == bt::statement_kind::part_digests && s->body.slot == own_slot)
        if (auto d = bt::parse_digests_payload(s->body.payload))
          committed.emplace(s->body.signer, *d);
      if (s->body.kind == bt::statement_kind::projections && s->body.slot == own_slot)
        if (auto p = bt::parse_projections_payload(s->body.payload))
          projections[s->body.signer] = *p;
      if (s->body.kind == bt::statement_kind::mprng_commit && s->body.slot == mprng_slot)
        if (auto d = bt::digest_of_string(s->body.payload))
          commits[s->body.signer] = *d;
      if (s->body.kind == bt::statement_kind::mprng_reveal && s->body.slot == mprng_slot)
        if (auto d = bt::digest_of_string(s->body.payload))
          reveals[s->body.signer] = *d;
    }
    for (auto& p : a.at("proofs")) {
      auto first = statement_of(p.at(0), t);
      auto second = statement_of(p.at(1), t);
      if (first && second && !bt::check_equivocation({*first, *second}))
        problem("a logged equivocation proof does not check");
    }
    std::optional<bt::digest> r;
    if (a.contains("r")) {
      r = digest_of(a.at("r"));
      ++report.draws;
      auto att = a.at("mprng_attempt").get<uint32_t>();
      for (auto& [k, rv] : reveals) {
        auto c = commits.find(k);
        if (c == commits.end() || c->second != bt::mprng_commitment(t, att, k, rv))
          problem(fmt::format("the MPRNG reveal of {} does not match its commitment",
                              to_hex(k).substr(0, 12)));
      }
      if (reveals.size() != members.size())
        problem(fmt::format("{} reveals for {} members", reveals.size(), members.size()));
      if (!r || *r != bt::mprng_value(t, att, reveals))
        problem("r is not the hash of the reveals in key order");
      // Validators from r.
      if (r) {
        bt::validator_options vo;
        vo.count = std::min(h.validators, members.size() >= 2 ? members.size() - 1 : 0);
        auto vals = bt::draw_validators(*r, members, {}, vo);
        std::vector<std::pair<std::string, std::string>> logged;
        for (auto& v : a.at("validations"))
          if (auto x = key_of(v.at(0)), y = key_of(v.at(1)); x && y)
            logged.emplace_back(*x, *y);
        std::vector<std::pair<std::string, std::string>> want;
        if (vals)
          for (auto& v : *vals)
            want.emplace_back(v.validator, v.target);
        if (logged != want)
          problem("the validators are not the ones r draws");
      }
      check_aggregates(a, members, r, projections);
    }
    verdicts(t, a, members, committed);
    return r;
  }

  void check_aggregates(const json& a, const std::vector<std::string>& members,
                        const std::optional<bt::digest>& r,
                        const std::map<std::string, std::vector<std::pair<double, double>>>& signed_pairs) {
    auto parts = bt::equal_parts(h.dim, members.size());
    if (!parts || !r) {
      problem("the group cannot split the model");
      return;
    }
    bt::aggregate_check_options co;
    co.tau = h.tau;
    co.tolerance = h.tolerance;
    co.sigmas = h.sigmas;
    for (auto& c : a.at("checks")) {
      ++report.checks;
      auto i = c.at("part").get<uint64_t>();
      if (i >= parts->size()) {
        problem(fmt::format("a check of part {} of {}", i, parts->size()));
        continue;
      }
      std::map<std::string, bt::projection> pairs;
      for (auto& [k, list] : signed_pairs)
        if (i < list.size())
          pairs[k] = {list[i].first, list[i].second};
      if (pairs.size() != members.size()) {
        problem(fmt::format("part {} has {} projection pairs for {} members", i, pairs.size(),
                            members.size()));
        continue;
      }
      auto z = bt::gaussian_direction(bt::direction_seed(*r, i), (*parts)[i].size());
      bt::part_facts f{(*parts)[i].size(), c.at("aggregate_norm").get<double>(),
                       bt::norm_of(z.data(), z.size())};
      auto out = bt::check_aggregate(pairs, f, co);
      if (!out) {
        problem(fmt::format("part {}: {}", i, out.error().what));
        continue;
      }
      if (c.value("recomputed", false) && c.at("accepted").get<bool>())
        problem(fmt::format("part {}'s check is both accepted and verified by recomputation", i));
      if (out->accepted != c.at("accepted").get<bool>() || out->residual != c.at("residual").get<double>())
        problem(fmt::format("part {}'s aggregate check gives residual {:.6g} ({}), the log says "
                            "{:.6g} ({})",
                            i, out->residual, out->accepted ? "accepted" : "rejected",
                            c.at("residual").get<double>(),
                            c.at("accepted").get<bool>() ? "accepted" : "rejected"));
    }
  }

  void verdicts(uint64_t t, const json& a, const std::vector<std::string>& members,
                const std::map<std::string, std::vector<bt::digest>>& committed) {
    for (auto& v : a.at("verdicts")) {
      ++report.verdicts;
      auto acc = statement_of(v.at("accusation"), t);
      if (!acc)
        continue;
      auto parsed = bt::parse_accusation(acc->body.payload);
      if (!parsed) {
        problem("an accusation does not parse");
        continue;
      }
      result<bt::verdict> d = fail("not decided");
      if (parsed->kind == bt::accusation_kind::equivocation) {
        std::optional<bt::equivocation_proof> proof;
        if (v.contains("proof")) {
          auto f = statement_of(v.at("proof").at(0), t);
          auto s = statement_of(v.at("proof").at(1), t);
          if (f && s)
            proof = bt::equivocation_proof{*f, *s};
        }
        d = bt::decide_equivocation(*acc, proof ? &*proof : nullptr);
      } else {
        auto name = v.at("outcome").get<std::string>();
        std::optional<bt::recheck> outcome;
        for (auto r : {bt::recheck::confirmed, bt::recheck::refuted, bt::recheck::undecidable})
          if (name == bt::recheck_name(r))
            outcome = r;
        if (!outcome) {
          problem(fmt::format("unknown re-check outcome '{}'", name));
          continue;
        }
        if (recompute && parsed->kind == bt::accusation_kind::wrong_gradient) {
          auto again = recompute_gradient(t, a.at("attempt").get<uint32_t>(), members,
                                          parsed->accused, committed);
          if (again && *again != *outcome)
            problem(fmt::format("a wrong_gradient re-check says '{}'; recomputed from the "
                                "checkpoint it is '{}'",
                                name, bt::recheck_name(*again)));
        }
        d = bt::decide(*acc, *outcome);
      }
      if (!d) {
        problem(fmt::format("a verdict cannot be re-derived: {}", d.error().what));
        continue;
      }
      std::vector<std::string> banned;
      for (auto& k : v.at("banned"))
        if (auto x = key_of(k))
          banned.push_back(*x);
      if (v.at("action").get<std::string>() != bt::verdict_action_name(d->action)
          || banned != d->banned)
        problem(fmt::format("a {} verdict says '{}' banning {} key(s); its rule gives '{}' "
                            "banning {}",
                            bt::accusation_kind_name(parsed->kind),
                            v.at("action").get<std::string>(), banned.size(),
                            bt::verdict_action_name(d->action), d->banned.size()));
    }
    report.bans += a.at("banned").size();
  }
};

} // namespace

result<audit_report> check_audit(const std::string& path, bool recompute) {
  std::ifstream in(path);
  if (!in)
    return fail(fmt::format("cannot read {}", path));
  checker c;
  c.recompute = recompute;
  c.dir = checkpoint_dir(path);
  std::string text, prev;
  bool have_header = false;
  while (std::getline(in, text)) {
    ++c.line_no;
    json j;
    try {
      j = json::parse(text);
    } catch (const std::exception& e) {
      c.problem(fmt::format("not JSON ({})", e.what()));
      prev = line_hash(text);
      continue;
    }
    if (!j.is_object()) {
      c.problem("not a JSON object");
      prev = line_hash(text);
      continue;
    }
    if (j.value("prev", std::string("?")) != prev)
      c.problem(fmt::format("the chain breaks here: the line before (line {}) is not the one "
                            "this line follows",
                            c.line_no - 1));
    prev = line_hash(text);
    try {
      if (!have_header) {
        have_header = true;
        try {
          c.header(j);
        } catch (const std::runtime_error& e) {
          return fail(e.what());
        }
        continue;
      }
      if (j.value("kind", "") != "step") {
        c.problem("not a step line");
        continue;
      }
      c.step(j);
    } catch (const std::exception& e) {
      c.problem(fmt::format("malformed: {}", e.what()));
    }
  }
  if (!have_header)
    return fail(fmt::format("{} has no header line", path));
  return c.report;
}

} // namespace starling::runtime::btard
