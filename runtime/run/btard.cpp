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
//     phase_deadline: 10s           # across processes: a phase's wait for every peer's marker
//     poll: 100ms                   # across processes: how often a peer reads the board
//
// `starling run` (with or without --sim) runs every rule in one process, side by side. Across
// processes (`starling node`, cluster mode) the run is one BTARD group: role `btard.peer`, one
// instance per peer placed over the nodes, each signing with its node's key (one peer per
// node) or a key derived from it, meeting on the DHT (actors/btard/board_actor.hpp); a peer
// out of the group (silent, behind, or on a restarted node) comes back with the state the
// others sign. Node 0's reporter prints each step once every peer that took it agrees on the
// parameters, and ends the run when the live peers are done.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include "actors/auth/identity.hpp"
#include "actors/btard/aggregate_check.hpp"
#include "actors/btard/board_actor.hpp"
#include "actors/vi/adversarial.hpp"
#include "messages/metrics.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/role.hpp"
#include "runtime/btard/audit.hpp"
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

/// A BTARD peer of a run across processes.
struct btard_peer_role {
  btard::experiment_options x;
  std::chrono::nanoseconds phase_deadline = std::chrono::seconds(10);
  std::chrono::nanoseconds poll = std::chrono::milliseconds(100);
};

/// What node 0 hears from the peers of a run across processes.
class btard_cluster_reporter : public reporter {
public:
  explicit btard_cluster_reporter(btard_peer_role r) : r_(std::move(r)) {}

  void on_metric(const metric_record& m) override {
    if (m.kind == "btard_step") {
      auto& p = peers_[m.source];
      auto step = static_cast<uint64_t>(m.value("step"));
      p.last_step = step;
      p.peer = label(m, "peer");
      p.attack = label(m, "attack");
      auto& s = steps_[step];
      if (m.value("applied") > 0)
        s.digests[label(m, "params")].insert(m.source);
      s.reports++;
      s.members = std::max(s.members, static_cast<size_t>(m.value("members")));
      s.attempts = std::max(s.attempts, static_cast<size_t>(m.value("attempts")));
      s.ms = std::max(s.ms, m.value("ms"));
      if (m.values.count("accuracy"))
        s.accuracy = m.value("accuracy");
      for (auto& b : split(label(m, "bans")))
        bans_[b].insert(m.source);
      max_step_ = std::max(max_step_, step);
    } else if (m.kind == "btard_done") {
      auto& p = peers_[m.source];
      p.done = true;
      p.error = label(m, "error");
      p.banned = m.value("banned") > 0;
      p.peer = p.peer.empty() ? label(m, "peer") : p.peer;
    } else if (m.kind == "btard_enforced") {
      enforced_[label(m, "key")].insert(m.source);
    } else if (m.kind == "btard_left") {
      peers_[m.source].left = true;
    } else if (m.kind == "btard_rejoin") {
      auto& p = peers_[m.source];
      p.rejoined.push_back(static_cast<uint64_t>(m.value("step")));
      p.done = false; // a restarted peer's process is a new life of the same peer
    } else if (m.kind == "btard_tau") {
      tau_ = m.value("tau");
    }
  }

  bool tick(double t) override {
    // One line per step once every peer that took it reported it (or the next step began).
    while (steps_.count(printed_) && (steps_.at(printed_).reports >= live_count(printed_) ||
                                      max_step_ > printed_ + 1)) {
      auto& s = steps_.at(printed_);
      std::string acc = s.accuracy >= 0 ? fmt::format(", accuracy {:.2f}%", 100 * s.accuracy)
                                        : std::string();
      fmt::print(stderr, "  {:6.1f} s: step {} of {}: {} members, {} aggregation{}, {} "
                 "parameter digest{}{}{}\n",
                 t, printed_ + 1, r_.x.steps, s.members, s.attempts, s.attempts == 1 ? "" : "s",
                 s.digests.size(), s.digests.size() == 1 ? " (peers agree)" : "s",
                 acc, bans_text());
      ++printed_;
    }
    if (peers_.empty())
      return false;
    size_t live = 0, done = 0;
    for (auto& [src, p] : peers_) {
      bool gone = !p.done && p.last_step + 2 < max_step_;
      if (gone)
        continue;
      ++live;
      done += p.done ? 1 : 0;
    }
    return live > 0 && done == live && peers_.size() >= 1 && all_started();
  }

  int finish(finish_context& ctx) override {
    size_t disagreements = 0, applied = 0;
    for (auto& [step, s] : steps_) {
      if (s.digests.size() > 1)
        ++disagreements;
      if (!s.digests.empty())
        ++applied;
    }
    fmt::print("\nbtard across processes: {} peers, {} steps applied, {:.1f} s wall{}\n",
               peers_.size(), applied, ctx.wall_s,
               tau_ > 0 ? fmt::format(", tau {:.4g}", tau_) : std::string());
    fmt::print("  {:<10} {:<18} {:>10} {}\n", "peer", "attack", "last step", "end");
    int rc = 0;
    for (auto& [src, p] : peers_) {
      std::string end =
          p.done ? (!p.error.empty() ? p.error
                                     : p.banned ? "banned"
                                                : p.left ? "left (silent in the others' views)"
                                                         : "done")
                 : "gone (no word since its last step)";
      if (!p.rejoined.empty()) {
        std::string at;
        for (auto s : p.rejoined)
          at += fmt::format("{}{}", at.empty() ? "" : ", ", s + 1);
        end += fmt::format("; came back at step {}", at);
      }
      if (p.done && !p.error.empty())
        rc = 1;
      fmt::print("  {:<10} {:<18} {:>10} {}\n", p.peer, p.attack.empty() ? "none" : p.attack,
                 p.last_step + 1, end);
    }
    fmt::print("  bans: {}\n", bans_.empty() ? std::string("none") : bans_text().substr(8));
    if (!enforced_.empty()) {
      std::string s;
      for (auto& [k, who] : enforced_)
        s += fmt::format("{}{} ({} node{})", s.empty() ? "" : ", ", k, who.size(),
                         who.size() == 1 ? "" : "s");
      fmt::print("  bans taken by the nodes' gates: {}\n", s);
    } else {
      fmt::print("  bans taken by the nodes' gates: none (peers with their own keys: the protocol "
                 "alone enforces bans)\n");
    }
    fmt::print("  steps where peers held different parameters: {}\n", disagreements);
    double last_acc = -1;
    for (auto& [step, s] : steps_)
      if (s.accuracy >= 0)
        last_acc = s.accuracy;
    if (last_acc >= 0)
      fmt::print("  final accuracy: {:.2f}%\n", 100 * last_acc);
    if (disagreements > 0)
      rc = 1;
    return rc;
  }

private:
  struct peer_state {
    uint64_t last_step = 0;
    bool done = false, banned = false, left = false;
    std::string error, peer, attack;
    /// Steps at which it came back into the group with the state the others signed.
    std::vector<uint64_t> rejoined;
  };
  struct step_state {
    std::map<std::string, std::set<std::string>> digests;
    size_t reports = 0, members = 0, attempts = 0;
    double ms = 0, accuracy = -1;
  };
  static std::string label(const metric_record& m, const std::string& k) {
    auto it = m.labels.find(k);
    return it == m.labels.end() ? std::string() : it->second;
  }
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < s.size()) {
      auto comma = s.find(',', start);
      if (comma == std::string::npos)
        comma = s.size();
      if (comma > start)
        out.push_back(s.substr(start, comma - start));
      start = comma + 1;
    }
    return out;
  }
  size_t live_count(uint64_t step) const {
    size_t n = 0;
    for (auto& [src, p] : peers_)
      if (p.last_step >= step || (!p.done && p.last_step + 2 >= max_step_))
        ++n;
    return n;
  }
  bool all_started() const { return peers_.size() >= 1; }
  std::string bans_text() const {
    if (bans_.empty())
      return {};
    std::string s = ", bans: ";
    bool first = true;
    for (auto& [k, who] : bans_) {
      s += (first ? "" : " ") + k;
      first = false;
    }
    return s;
  }
  btard_peer_role r_;
  std::map<std::string, peer_state> peers_;
  std::map<uint64_t, step_state> steps_;
  std::map<std::string, std::set<std::string>> bans_;
  /// Bans handed to a node's gate, by banned key: the peers whose nodes took them.
  std::map<std::string, std::set<std::string>> enforced_;
  uint64_t printed_ = 0, max_step_ = 0;
  double tau_ = 0;
};

/// The task of a run's options, one per process: a node's peers share the loaded data set and
/// model (the MLP task is a pure function of its immutable data, safe to call from the peers'
/// threads at once). Each peer loading its own copy made a node of four peers start one peer
/// every ~2.5 s (a Fashion-MNIST load each), which delayed the run's start and a restarted
/// node's return by ~10 s.
result<std::shared_ptr<const bt::task>> shared_task(const btard::experiment_options& o) {
  static std::mutex lock;
  static std::map<std::string, std::weak_ptr<const bt::task>> cache;
  auto key = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}", o.data_dir,
                         o.synthetic_when_absent, o.seed, o.train_samples, o.eval_samples,
                         o.model.hidden, o.model.batch, o.model.seed, o.model.eval_samples);
  std::lock_guard<std::mutex> hold(lock);
  if (auto t = cache[key].lock())
    return t;
  auto t = btard::make_task(o);
  if (t)
    cache[key] = *t;
  return t;
}

caf::actor spawn_btard_peer(role_context& ctx, const btard_peer_role& r) {
  auto o = r.x;
  auto sink = ctx.node.metrics();
  auto source = ctx.name;
  auto done = [sink, source](const std::string& peer, const std::string& error, bool banned) {
    if (!error.empty())
      fmt::print(stderr, "starling: {}: {}\n", source, error);
    messages::metric_event ev{source, "btard_done", {{"banned", banned ? 1.0 : 0.0}},
                              {{"peer", peer}}};
    if (!error.empty())
      ev.labels["error"] = error;
    caf::anon_send(sink, std::move(ev));
  };
  actors::vi::use_one_torch_thread();
  auto t = shared_task(o);
  if (!t) {
    done("", t.error().what, false);
    return {};
  }
  auto byz = btard::attackers_of(o);
  const bool attacker = byz[ctx.index % byz.size()];
  bt::board_peer_options bo;
  bo.core.group = o.group;
  bo.core.group.rule = bt::aggregation_rule::btard;
  bo.core.group.run_id = o.name;
  bo.core.group.seed = o.seed;
  if (attacker) {
    bo.core.gradient = o.attack;
    bo.core.protocol = o.protocol;
    bo.core.protocol_step = o.attack.start_step;
  }
  bo.model = *t;
  // With one peer on this node, the peer signs with the node's key, so what its verdicts ban
  // is a node key: the node's gate and DHT refuse the banned node from then on. With several
  // peers per node each has a key derived from the node's (run name and instance index hashed
  // with the node's seed): the protocol alone enforces bans (a gate ban would also refuse the
  // node's honest peers), and a restarted node's peers keep their keys, so they come back
  // through the state the group offers.
  size_t on_node = 0;
  for (auto& a : ctx.addresses_of(ctx.role.name))
    if (a.rfind(fmt::format("@{}/", ctx.node.index()), 0) == 0)
      ++on_node;
  const auto* node_key = ctx.node.node_key();
  if (node_key && on_node == 1) {
    bo.key = *node_key;
    bo.enforce_bans = true;
    bo.directory = ctx.node.node_directory();
  } else if (node_key) {
    bo.key = actors::auth::key_pair::from_seed(bt::hash_bytes(
        fmt::format("starling.btard.peer-key\n{}\n{}\n{}", o.name, ctx.index, node_key->seed())));
  } else {
    bo.key = actors::auth::key_pair::generate();
  }
  const std::string peer = actors::auth::to_hex(bo.key->public_key()).substr(0, 8);
  bt::peer_core_options checked = bo.core;
  checked.colluders = {bo.key->public_key()}; // the others' keys are known once they announce
  if (auto st = bt::validate(checked); !st) {
    done(peer, st.what(), false);
    return {};
  }
  if (attacker && o.attack.kind != bt::attack_kind::none)
    bo.colluders = static_cast<size_t>(std::count(byz.begin(), byz.end(), true));
  bo.dht = ctx.node.dht();
  // One reader per node: its peers poll the same keys (a read younger than half the poll
  // interval is shared).
  auto fresh = std::chrono::duration_cast<std::chrono::milliseconds>(r.poll) / 2;
  bo.reader = ctx.node.service("btard.reader", [fresh](host& h) {
    return bt::spawn_board_reader(h.system(), h.dht(), fresh);
  });
  bo.prefix = ctx.key_prefix() + "/btard";
  bo.peers = o.peers;
  bo.steps = o.steps;
  bo.poll = std::chrono::duration_cast<std::chrono::milliseconds>(r.poll);
  bo.phase_deadline = std::chrono::duration_cast<std::chrono::milliseconds>(r.phase_deadline);
  std::string attack_label;
  if (attacker) {
    if (o.attack.kind != bt::attack_kind::none)
      attack_label = bt::attack_name(o.attack.kind);
    if (o.protocol != bt::protocol_attack::none)
      attack_label += (attack_label.empty() ? "" : "+") + std::string(bt::protocol_attack_name(o.protocol));
  }
  auto model = *t;
  // The peer's audit log (`starling audit` re-checks it): every statement it read, its checks,
  // verdicts and bans, step by step.
  struct audit_state {
    std::string path;
    std::optional<btard::audit_writer> writer;
    bool failed = false;
    /// Set when the peer came back into the running group: its next steps go to a new log
    /// (`<name>.from-<step>.btard-audit.jsonl`) whose chain starts from the state it took.
    bool resumed = false;
  };
  auto audit = std::make_shared<audit_state>();
  if (!ctx.node.run_dir().empty())
    audit->path = fmt::format("{}/{}.btard-audit.jsonl", ctx.node.run_dir(), ctx.name);
  if (o.tau_factor > 0)
    bo.calibrate = [o, model, sink, source](const std::vector<std::string>& members)
        -> result<std::optional<double>> {
      auto tau = btard::calibrate_tau(o, *model, members);
      if (!tau)
        return fail(tau.error().what);
      caf::anon_send(sink, messages::metric_event{source, "btard_tau", {{"tau", *tau}}, {}});
      return std::optional<double>{*tau};
    };
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(
      std::chrono::steady_clock::now());
  bo.on_step = [o, model, sink, source, peer, attack_label, last,
                audit](const bt::step_record& rec, const bt::peer_core& core) {
    if (!audit->path.empty() && !audit->writer && !audit->failed && !rec.attempts.empty()) {
      auto g = o.group;
      g.rule = bt::aggregation_rule::btard;
      g.tau = core.tau();
      auto h = btard::audit_header_of(o, g, model->dim(), rec.attempts.front().members);
      auto path = audit->path;
      if (audit->resumed) {
        h.resumed_at = rec.step;
        h.r_resumed = bt::digest_string(rec.r_prev);
        auto suffix = std::string(".btard-audit.jsonl");
        path = path.substr(0, path.size() - suffix.size()) +
               fmt::format(".from-{}{}", rec.step, suffix);
      }
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
      auto w = btard::audit_writer::open(path, h);
      if (w)
        audit->writer.emplace(std::move(*w));
      else {
        audit->failed = true;
        fmt::print(stderr, "starling: {}: no audit log: {}\n", peer, w.error().what);
      }
    }
    if (audit->writer)
      if (auto st = audit->writer->write(rec); !st) {
        fmt::print(stderr, "starling: {}: audit log: {}\n", peer, st.what());
        audit->writer.reset();
        audit->failed = true;
      }
    auto now = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - *last).count();
    *last = now;
    messages::metric_event ev{source, "btard_step", {}, {}};
    ev.values["step"] = static_cast<double>(rec.step);
    ev.values["applied"] = rec.applied ? 1.0 : 0.0;
    ev.values["attempts"] = static_cast<double>(rec.attempts.size());
    ev.values["members"] =
        rec.attempts.empty() ? 0.0 : static_cast<double>(rec.attempts.back().members.size());
    ev.values["ms"] = ms;
    ev.values["refused"] = static_cast<double>(core.refused());
    if ((rec.step + 1) % o.eval_every == 0 || rec.step + 1 == o.steps) {
      auto e = model->evaluate(core.params());
      ev.values["accuracy"] = e.accuracy;
      ev.values["loss"] = e.loss;
    }
    ev.labels["peer"] = peer;
    ev.labels["attack"] = attack_label;
    auto it = rec.params.find(core.key());
    if (it != rec.params.end())
      ev.labels["params"] = bt::digest_hex(it->second).substr(0, 16);
    std::string bans;
    for (auto& [k, why] : core.bans())
      bans += (bans.empty() ? "" : ",") + actors::auth::to_hex(k).substr(0, 8);
    ev.labels["bans"] = bans;
    caf::anon_send(sink, std::move(ev));
  };
  auto banned_flag = std::make_shared<bool>(false);
  bo.on_step = [inner = bo.on_step, banned_flag](const bt::step_record& rec,
                                                 const bt::peer_core& core) {
    *banned_flag = core.phase() == bt::peer_phase::banned;
    inner(rec, core);
  };
  bo.on_enforced = [sink, source](const std::string& key, uint64_t removed) {
    caf::anon_send(sink, messages::metric_event{source, "btard_enforced",
                                                {{"removed", static_cast<double>(removed)}},
                                                {{"key", actors::auth::to_hex(key).substr(0, 8)}}});
  };
  auto left = std::make_shared<std::string>();
  bo.on_left = [left, source](const std::string& why) {
    *left = why;
    fmt::print(stderr, "starling: {}: {}\n", source, why);
  };
  bo.on_extended = [source](uint64_t step, uint64_t times) {
    fmt::print(stderr,
               "starling: {}: step {}: most of the group is past this wait (a marker is late on "
               "this node's board, not silent): waiting again ({} of at most 3)\n",
               source, step, times);
  };
  bo.on_returning_wait = [source](uint64_t step) {
    fmt::print(stderr,
               "starling: {}: step {}: waiting one more deadline for the members coming back "
               "(they take the state before they commit)\n",
               source, step);
  };
  bo.on_rejoin = [sink, source, audit](const std::string& what, uint64_t step) {
    fmt::print(stderr, "starling: {}: {}\n", source, what);
    if (step == 0)
      return;
    // The log so far ends where the peer left; the steps from here go to a log of their own.
    audit->writer.reset();
    audit->resumed = true;
    caf::anon_send(sink, messages::metric_event{source, "btard_rejoin",
                                                {{"step", static_cast<double>(step)}}, {}});
  };
  bo.on_finish = [done, peer, banned_flag, left, sink, source](const std::string& error) {
    if (!left->empty())
      caf::anon_send(sink, messages::metric_event{source, "btard_left", {}, {{"why", *left}}});
    done(peer, error, *banned_flag);
  };
  return bt::spawn_board_peer(ctx.node.system(), std::move(bo));
}

void expand_btard(config_node& n, experiment_graph& g, const expand_context& ctx) {
  btard::experiment_options o;
  btard_peer_role cluster;
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
  read_duration(n, "phase_deadline", cluster.phase_deadline);
  read_duration(n, "poll", cluster.poll);
  n.finish();
  if (cluster.phase_deadline <= std::chrono::nanoseconds{0} ||
      cluster.poll <= std::chrono::nanoseconds{0})
    n.fail("phase_deadline and poll must be positive durations");
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
  if (ctx.mode == run_mode::cluster) {
    if (o.rules.size() != 1 || o.rules[0] != bt::aggregation_rule::btard)
      n.fail("across processes the run is one BTARD group (aggregation: btard); the side-by-side "
             "comparison of rules runs in one process (starling run)");
    cluster.x = o;
    bt::peer_core_options probe;
    probe.group = o.group;
    probe.group.rule = bt::aggregation_rule::btard;
    probe.group.run_id = o.name;
    probe.gradient = o.attack;
    probe.protocol = o.protocol;
    probe.colluders = {std::string(32, 'k')}; // IPM and ALIE attackers meet at run time
    if (auto st = bt::validate(probe); !st)
      n.fail(st.what());
    role_spec peers;
    peers.name = "peer";
    peers.type = "btard.peer";
    peers.replicas = o.peers;
    peers.options = cluster;
    // Unsupervised: a peer with a fresh key cannot come back as itself. A peer signing with its
    // node's key comes back when the node restarts, through the state the group offers.
    peers.restart.supervised = false;
    g.roles.push_back(peers);
    g.reporters.push_back([cluster] { return std::make_unique<btard_cluster_reporter>(cluster); });
    return;
  }
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
  reg.add<btard_peer_role>(
      "btard.peer",
      "a BTARD peer across processes: commitments, MPRNG, checks, validators and verdicts on "
      "the DHT",
      [](role_context& ctx, const btard_peer_role& r) { return spawn_btard_peer(ctx, r); }, {},
      {}, [](const btard_peer_role& r) {
        return fmt::format("{} peers, {} steps, phase deadline {:.1f} s", r.x.peers, r.x.steps,
                           std::chrono::duration<double>(r.phase_deadline).count());
      });
  reg.add_kind({"btard",
                "Byzantine-tolerant training (BTARD-SGD): commitments, MPRNG, aggregate checks, "
                "validators, verdicts and bans, against the plain mean and CenteredClip",
                expand_btard});
}

} // namespace starling::runtime
