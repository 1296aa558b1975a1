#include "runtime/btard/experiment.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <malloc.h>

#include "actors/auth/identity.hpp"
#include "actors/btard/membership.hpp"
#include "actors/btard/mprng.hpp"
#include "actors/vi/adversarial.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/seeded_hash.hpp"
#include "runtime/btard/audit.hpp"

namespace starling::runtime::btard {

namespace bt = starling::actors::btard;

status validate(const experiment_options& o) {
  if (o.peers < 2)
    return fail(fmt::format("peers must be at least 2, not {}", o.peers));
  if (2 * o.byzantine >= o.peers)
    return fail(fmt::format("byzantine must be fewer than half the peers ({} of {})", o.byzantine,
                            o.peers));
  if (o.steps < 1)
    return fail("steps must be at least 1");
  if (o.rules.empty())
    return fail("no aggregation rule to run");
  if (o.eval_every < 1)
    return fail("eval_every must be at least 1");
  if (!(o.tau_factor >= 0) || !std::isfinite(o.tau_factor))
    return fail("tau_factor must be >= 0");
  if (auto st = bt::validate(o.attack); !st)
    return st;
  if (auto st = bt::validate(o.model); !st)
    return st;
  auto g = o.group;
  g.run_id = o.name;
  return bt::validate(g);
}

namespace {

std::vector<actors::auth::key_pair> keys_of(const experiment_options& o) {
  std::vector<actors::auth::key_pair> out;
  for (size_t i = 0; i < o.peers; ++i)
    out.push_back(actors::auth::key_pair::from_test_seed(o.seed * 65537 + i));
  return out;
}

} // namespace

std::vector<bool> attackers_of(const experiment_options& o) {
  std::vector<size_t> idx(o.peers);
  for (size_t i = 0; i < idx.size(); ++i)
    idx[i] = i;
  kernels::splitmix64_stream rng{o.seed ^ 0x62746172642d6279ULL};
  for (size_t i = 0; i < o.byzantine; ++i)
    std::swap(idx[i], idx[i + static_cast<size_t>(rng.below(o.peers - i))]);
  std::vector<bool> out(o.peers, false);
  for (size_t i = 0; i < o.byzantine; ++i)
    out[idx[i]] = true;
  return out;
}

/// τ = factor × the median distance of an honest gradient's part from the honest mean's part, at
/// the starting parameters with the first step's seeds (the experimenter's calibration).
result<double> calibrate_tau(const experiment_options& o, const bt::task& t,
                             const std::vector<std::string>& keys) {
  auto r0 = bt::initial_randomness(o.name, o.seed);
  auto init = t.initial();
  std::vector<std::vector<float>> grads;
  for (auto& k : keys) {
    auto g = t.gradient(init, bt::batch_seed(r0, k), false);
    if (!g)
      return fail(g.error().what);
    grads.push_back(std::move(*g));
  }
  auto parts = bt::equal_parts(t.dim(), keys.size());
  if (!parts)
    return fail(parts.error().what);
  std::vector<double> mean(t.dim(), 0.0);
  for (auto& g : grads)
    for (size_t k = 0; k < g.size(); ++k)
      mean[k] += g[k] / static_cast<double>(grads.size());
  std::vector<double> dist;
  for (auto& g : grads)
    for (auto& p : *parts) {
      double d = 0;
      for (auto k = p.begin; k < p.end; ++k)
        d += (g[k] - mean[k]) * (g[k] - mean[k]);
      dist.push_back(std::sqrt(d));
    }
  std::nth_element(dist.begin(), dist.begin() + static_cast<std::ptrdiff_t>(dist.size() / 2),
                   dist.end());
  return o.tau_factor * dist[dist.size() / 2];
}

audit_header audit_header_of(const experiment_options& o, const bt::group_options& g,
                             uint64_t dim, std::vector<std::string> peers) {
  audit_header h;
  h.run_id = o.name;
  h.seed = o.seed;
  h.dim = dim;
  h.peers = std::move(peers);
  h.rule = rule_name(g.rule);
  h.tau = g.tau;
  h.iterations = g.max_iterations;
  h.tolerance = g.tolerance;
  h.validators = g.validators;
  h.sigmas = g.sigmas;
  h.validation_rel_tolerance = g.validation_rel_tolerance;
  h.lr = g.lr;
  h.momentum = g.momentum;
  h.hidden = o.model.hidden;
  h.batch = o.model.batch;
  h.model_seed = o.seed;
  h.data_dir = o.data_dir;
  h.synthetic_when_absent = o.synthetic_when_absent;
  h.train_samples = o.train_samples;
  return h;
}

result<std::shared_ptr<const bt::task>> make_task(const experiment_options& o) {
  kernels::idx_source_options train_o, eval_o;
  train_o.dir = eval_o.dir = o.data_dir;
  train_o.synthetic_when_absent = eval_o.synthetic_when_absent = o.synthetic_when_absent;
  train_o.synthetic_seed = eval_o.synthetic_seed = o.seed;
  train_o.max_items = o.train_samples;
  eval_o.train = false;
  eval_o.max_items = o.eval_samples;
  auto train = kernels::idx_source::load(train_o);
  if (!train)
    return fail(train.error().what);
  auto eval = kernels::idx_source::load(eval_o);
  if (!eval)
    return fail(eval.error().what);
  auto model = o.model;
  model.seed = o.seed;
  return bt::make_mlp_task(*train, *eval, model);
}

namespace {

status keep_checkpoint(const std::string& audit_path, uint64_t step,
                       const std::vector<float>& theta) {
  auto dir = checkpoint_dir(audit_path);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return fail(fmt::format("cannot create {}: {}", dir, ec.message()));
  auto path = fmt::format("{}/step-{}.params", dir, step);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(theta.data()),
            static_cast<std::streamsize>(theta.size() * sizeof(float)));
  if (!out)
    return fail(fmt::format("writing {} failed", path));
  return {};
}

std::string attack_label(const experiment_options& o) {
  std::string s;
  if (o.attack.kind != bt::attack_kind::none)
    s = bt::attack_name(o.attack.kind);
  if (o.protocol != bt::protocol_attack::none)
    s += (s.empty() ? "" : " + ") + std::string(bt::protocol_attack_name(o.protocol));
  return s.empty() ? "none" : s;
}

} // namespace

result<std::vector<rule_outcome>> run_experiment(const experiment_options& opts,
                                                 const std::string& out_dir) {
  if (auto st = validate(opts); !st)
    return fail(st.what());
  auto o = opts;
  actors::vi::use_one_torch_thread();
  // Every peer's gradient, part and parameter vector is a fresh allocation above glibc's 128 KiB
  // mmap threshold: each would be mapped, faulted in page by page and unmapped. Serving them
  // from the heap more than halves a plain step's time (measured: 37 ms -> 14 ms per step of 16
  // peers with the 784-64-10 MLP).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  auto t = make_task(o);
  if (!t)
    return fail(t.error().what);
  auto keys = keys_of(o);
  std::vector<std::string> public_keys;
  for (auto& k : keys)
    public_keys.push_back(k.public_key());
  auto byz = attackers_of(o);
  if (o.tau_factor > 0) {
    auto tau = calibrate_tau(o, **t, public_keys);
    if (!tau)
      return fail(tau.error().what);
    fmt::print("btard: tau = {:.4g} ({} x the median distance of an honest gradient part from the "
               "honest mean at step 0)\n",
               *tau, o.tau_factor);
    o.group.tau = *tau;
  }
  fmt::print("btard: {} peers, {} Byzantine (peers {}), attack {} from step {}; {}\n", o.peers,
             o.byzantine,
             [&] {
               std::string s;
               for (size_t i = 0; i < byz.size(); ++i)
                 if (byz[i])
                   s += (s.empty() ? "" : ",") + std::to_string(i);
               return s.empty() ? std::string("none") : s;
             }(),
             attack_label(o), o.attack.start_step, (*t)->describe());
  auto start_eval = (*t)->evaluate((*t)->initial());
  fmt::print("btard: untrained model: accuracy {:.2f}%, loss {:.3f}\n", 100 * start_eval.accuracy,
             start_eval.loss);
  std::fflush(stdout);

  std::vector<rule_outcome> outcomes;
  for (auto rule : o.rules) {
    std::vector<bt::peer_spec> specs(o.peers);
    for (size_t i = 0; i < o.peers; ++i)
      if (byz[i]) {
        specs[i].gradient = o.attack;
        specs[i].protocol = o.protocol;
        specs[i].protocol_step = o.attack.start_step;
      }
    auto g = o.group;
    g.rule = rule;
    g.run_id = o.name;
    g.seed = o.seed;
    auto group = bt::simulated_group::make(g, *t, specs, keys);
    if (!group)
      return fail(group.error().what);
    rule_outcome oc;
    oc.rule = rule;
    std::unique_ptr<audit_writer> audit;
    if (rule == bt::aggregation_rule::btard) {
      oc.audit_path = out_dir + "/btard-audit.jsonl";
      auto h = audit_header_of(o, g, (*t)->dim(), public_keys);
      std::error_code ec;
      std::filesystem::remove_all(checkpoint_dir(oc.audit_path), ec);
      auto w = audit_writer::open(oc.audit_path, h);
      if (!w)
        return fail(w.error().what);
      audit = std::make_unique<audit_writer>(std::move(*w));
    }
    fmt::print("\naggregation {}:\n", rule_name(rule));
    size_t honest_index = 0;
    while (byz[honest_index])
      ++honest_index;
    std::set<std::string> seen_bans;
    size_t clipped = 0, inputs = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t s = 0; s < o.steps; ++s) {
      std::vector<float> theta;
      if (audit)
        theta = (*group)->model();
      auto rec = (*group)->step();
      if (!rec)
        return fail(fmt::format("{} step {}: {}", rule_name(rule), s, rec.error().what));
      if (audit) {
        if (auto st = audit->write(*rec); !st)
          return fail(st.what());
        // θ_t of a step with a gradient accusation, for `starling audit --recompute`.
        bool gradient_verdict = false;
        for (auto& a : rec->attempts)
          for (auto& v : a.verdicts)
            if (auto acc = bt::parse_accusation(v.accusation.body.payload);
                acc && acc->kind == bt::accusation_kind::wrong_gradient)
              gradient_verdict = true;
        if (gradient_verdict)
          if (auto st = keep_checkpoint(oc.audit_path, s, theta); !st)
            return fail(st.what());
      }
      if (rec->attempts.size() > 1)
        ++oc.redone_steps;
      oc.ms_split["gradients"] += rec->ms_gradients;
      oc.ms_split["attacks"] += rec->ms_attacks;
      oc.ms_split["apply"] += rec->ms_apply;
      for (auto& a : rec->attempts) {
        clipped += a.clipped;
        inputs += a.inputs;
        oc.bytes_data += static_cast<double>(a.bytes_data);
        oc.bytes_statements += static_cast<double>(a.bytes_statements);
        for (auto& c : a.checks)
          oc.recomputed_checks += c.recomputed ? 1 : 0;
        for (auto& [phase, ms] : a.ms)
          oc.ms_split[phase] += ms;
      }
      for (auto& [k, why] : (*group)->bans_of(honest_index)) {
        if (!seen_bans.insert(k).second)
          continue;
        auto i = *(*group)->index_of(k);
        if (byz[i]) {
          ++oc.attackers_banned;
          oc.ban_steps.push_back(s);
        } else {
          ++oc.honest_banned;
        }
      }
      if ((s + 1) % o.eval_every == 0 || s + 1 == o.steps) {
        auto ev = (*t)->evaluate((*group)->model());
        auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        fmt::print("  step {:>5}/{}  accuracy {:6.2f}%  loss {:8.4f}  banned {}/{} attackers, {} "
                   "honest  redone steps {}  checks recomputed {}  clipped {:.1f}%  {:.1f} "
                   "ms/step\n",
                   s + 1, o.steps, 100 * ev.accuracy, ev.loss, oc.attackers_banned, o.byzantine,
                   oc.honest_banned, oc.redone_steps, oc.recomputed_checks,
                   inputs ? 100.0 * static_cast<double>(clipped) / static_cast<double>(inputs) : 0.0,
                   1000 * secs / static_cast<double>(s + 1));
        std::fflush(stdout);
      }
    }
    oc.ms_per_step = 1000
                     * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                     / static_cast<double>(o.steps);
    for (auto& [phase, ms] : oc.ms_split)
      ms /= static_cast<double>(o.steps);
    oc.bytes_data /= static_cast<double>(o.steps);
    oc.bytes_statements /= static_cast<double>(o.steps);
    auto ev = (*t)->evaluate((*group)->model());
    oc.accuracy = ev.accuracy;
    oc.loss = ev.loss;
    oc.clipped = inputs ? static_cast<double>(clipped) / static_cast<double>(inputs) : 0.0;
    if (audit) {
      auto head = audit->head();
      audit.reset();
      auto report = check_audit(oc.audit_path, true);
      if (!report)
        return fail(report.error().what);
      if (!report->problems.empty())
        return fail(fmt::format("the audit log {} does not check: {}", oc.audit_path,
                                report->problems.front()));
      fmt::print("  audit: {} checks ({} steps, {} signed statements, {} MPRNG draws, {} aggregate "
                 "checks, {} verdicts re-derived, {} of them recomputed)\n",
                 oc.audit_path, report->steps, report->statements, report->draws, report->checks,
                 report->verdicts, report->recomputed);
      fmt::print("  audit digest {} (the last line's BLAKE2b-256: the same seed gives the same "
                 "log)\n",
                 head.substr(0, 16));
    }
    outcomes.push_back(oc);
  }
  fmt::print("\nbtard: {} peers, {} Byzantine, attack {}, {} steps\n", o.peers, o.byzantine,
             attack_label(o), o.steps);
  fmt::print("  {:<14} {:>9} {:>8} {:>16} {:>7} {:>8} {:>8} {:>9}\n", "aggregation", "accuracy",
             "loss", "attackers banned", "honest", "redone", "clipped", "ms/step");
  for (auto& oc : outcomes)
    fmt::print("  {:<14} {:>8.2f}% {:>8.4f} {:>10}/{:<5} {:>7} {:>8} {:>7.1f}% {:>9.1f}\n",
               rule_name(oc.rule), 100 * oc.accuracy, oc.loss, oc.attackers_banned, o.byzantine,
               oc.honest_banned, oc.redone_steps, 100 * oc.clipped, oc.ms_per_step);
  fmt::print("\n  time per step (ms, the whole group in one thread) and bytes per step (the group's "
             "total)\n");
  std::vector<std::string> phases{"gradients", "attacks",  "commit", "deliver",
                                  "aggregate", "hash",     "mprng",  "check",
                                  "validate",  "verdicts", "other",  "apply"};
  fmt::print("  {:<14}", "aggregation");
  for (auto& p : phases)
    fmt::print(" {:>9}", p);
  fmt::print(" {:>9} {:>11} {:>11}\n", "total", "data B", "signed B");
  for (auto& oc : outcomes) {
    fmt::print("  {:<14}", rule_name(oc.rule));
    for (auto& p : phases) {
      auto it = oc.ms_split.find(p);
      fmt::print(" {:>9.2f}", it == oc.ms_split.end() ? 0.0 : it->second);
    }
    fmt::print(" {:>9.2f} {:>11.0f} {:>11.0f}\n", oc.ms_per_step, oc.bytes_data,
               oc.bytes_statements);
  }
  std::fflush(stdout);
  return outcomes;
}

} // namespace starling::runtime::btard
