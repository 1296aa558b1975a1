// The `btard` kind: Byzantine-tolerant training (runtime/btard/experiment.hpp) from YAML.
//
//   btard:
//     peers: 16
//     byzantine: 7
//     steps: 300
//     aggregation: btard            # or a list: [mean, centered_clip, btard]
//     attack: sign_flip             # a gradient attack, a protocol attack, or none
//     attack_start: 20
//     attack_every: 1
//     tau: 1.0                      # or tau_factor: 2 (τ from the honest spread at step 0)
//     iterations: 100
//     tolerance: 1.0e-6
//     validators: 1
//     lr: 0.1
//     momentum: 0.9
//     hidden: 64
//     batch: 32
//     eval_every: 50
//     data_dir: /usr/share/datasets/fashion-mnist
//     synthetic: false              # synthetic images when Fashion-MNIST is absent
//     train_samples: 0
//     eval_samples: 0
#include <algorithm>

#include <fmt/format.h>

#include "actors/btard/aggregate_check.hpp"
#include "runtime/btard/experiment.hpp"
#include "runtime/config/reader.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/run/kinds.hpp"

namespace starling::runtime {

namespace {

namespace bt = starling::actors::btard;

void read_rules(config_node& n, std::vector<bt::aggregation_rule>& out) {
  if (!n.has("aggregation"))
    return;
  auto node = n.child("aggregation");
  std::vector<config_node> items;
  if (node.is_sequence())
    items = node.items();
  else
    items.push_back(node);
  if (items.empty())
    node.expected("mean, centered_clip, btard, or a list of them");
  out.clear();
  for (auto& item : items) {
    auto r = bt::parse_rule(item.as_string());
    if (!r)
      item.fail(r.error().what);
    if (std::find(out.begin(), out.end(), *r) != out.end())
      item.fail("listed twice");
    out.push_back(*r);
  }
}

void read_attack(config_node& n, btard::experiment_options& o) {
  if (!n.has("attack"))
    return;
  auto node = n.child("attack");
  auto name = node.as_string();
  if (name == "none")
    return;
  if (auto g = bt::parse_attack(name)) {
    o.attack.kind = *g;
    return;
  }
  if (auto p = bt::parse_protocol_attack(name)) {
    o.protocol = *p;
    return;
  }
  std::string known = "none";
  for (auto k : {bt::attack_kind::sign_flip, bt::attack_kind::random_direction,
                 bt::attack_kind::label_flip, bt::attack_kind::delayed, bt::attack_kind::ipm,
                 bt::attack_kind::alie})
    known += std::string(", ") + bt::attack_name(k);
  for (auto p : bt::protocol_attacks())
    known += std::string(", ") + bt::protocol_attack_name(p);
  node.fail(fmt::format("unknown attack '{}' (known: {})", name, known));
}

void expand_btard(config_node& n, experiment_graph& g, const expand_context& ctx) {
  if (ctx.mode == run_mode::cluster)
    n.fail("btard runs in one process (starling run, with or without --sim); across processes "
           "(starling node) it does not run yet");
  btard::experiment_options o;
  o.name = g.name;
  o.seed = g.seed;
  read_non_negative(n, "peers", o.peers);
  read_non_negative(n, "byzantine", o.byzantine);
  read_non_negative(n, "steps", o.steps);
  read_rules(n, o.rules);
  read_attack(n, o);
  read_non_negative(n, "attack_start", o.attack.start_step);
  read_non_negative(n, "attack_every", o.attack.every);
  read_real(n, "attack_scale", o.attack.scale, 1e-9, 1e12);
  read_real(n, "attack_epsilon", o.attack.epsilon, 1e-9, 1e6);
  read_non_negative(n, "attack_delay", o.attack.delay);
  read_non_negative(n, "attack_duration", o.attack.duration);
  o.attack.direction_seed = o.seed;
  read_real(n, "tau", o.group.tau, 1e-12, 1e12);
  read_real(n, "tau_factor", o.tau_factor, 0, 1e6);
  int64_t iterations = static_cast<int64_t>(o.group.max_iterations);
  read_int(n, "iterations", iterations, 1, 100000);
  o.group.max_iterations = static_cast<size_t>(iterations);
  read_real(n, "tolerance", o.group.tolerance, 1e-300, 1e6);
  read_non_negative(n, "validators", o.group.validators);
  read_real(n, "validation_tolerance", o.group.validation_rel_tolerance, 0, 1);
  read_real(n, "lr", o.group.lr, 1e-9, 1e3);
  read_real(n, "momentum", o.group.momentum, 0, 0.999999);
  read_non_negative(n, "cool_down", o.group.membership.cool_down);
  read_non_negative(n, "silence_window", o.group.membership.silence_window);
  read_non_negative(n, "silences_to_ban", o.group.membership.silences_to_ban);
  read_non_negative(n, "hidden", o.model.hidden);
  read_non_negative(n, "batch", o.model.batch);
  read_non_negative(n, "eval_every", o.eval_every);
  read(n, "data_dir", o.data_dir);
  read(n, "synthetic", o.synthetic_when_absent);
  read_non_negative(n, "train_samples", o.train_samples);
  read_non_negative(n, "eval_samples", o.eval_samples);
  n.finish();
  if (auto st = btard::validate(o); !st)
    n.fail(st.what());
  // The iteration cap must let honest aggregates converge (aggregate_check.hpp): with at most
  // `byzantine` inputs clipped the step falls below the tolerance within this many iterations.
  auto need = bt::centered_clip_iterations_bound(o.group.tau, o.group.tolerance, o.byzantine,
                                                 o.peers);
  if (need && o.group.max_iterations < *need && !o.rules.empty())
    n.fail(fmt::format("iterations {} is below the {} CenteredClip needs to converge with {} of {} "
                       "inputs clipped at tau {} and tolerance {} (aggregate_check.hpp); an "
                       "aggregate that stops short fails the aggregate check",
                       o.group.max_iterations, *need, o.byzantine, o.peers, o.group.tau,
                       o.group.tolerance));
  g.nodes = g.nodes == 0 ? 1 : g.nodes;
  g.study = [o](const experiment_graph&, const run_function&, const std::string& out_dir) {
    auto out = btard::run_experiment(o, out_dir);
    if (!out) {
      fmt::print(stderr, "starling: error: {}\n", out.error().what);
      return 1;
    }
    return 0;
  };
}

} // namespace

void add_btard(role_registry& reg) {
  reg.add_kind({"btard",
                "Byzantine-tolerant training (BTARD-SGD): commitments, MPRNG, aggregate checks, "
                "validators, verdicts and bans, against the plain mean and CenteredClip",
                expand_btard});
}

} // namespace starling::runtime
