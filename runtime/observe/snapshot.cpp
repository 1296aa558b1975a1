#include "runtime/observe/snapshot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace starling::runtime::observe {

namespace {

double value_of(const event_view& e, const char* key, double fallback) {
  auto i = e.values.find(key);
  return i == e.values.end() ? fallback : i->second;
}

const std::string& label_of(const event_view& e, const char* key) {
  static const std::string none;
  auto i = e.labels.find(key);
  return i == e.labels.end() ? none : i->second;
}

/// The role of an instance name outside the plan: `<role>.<index>` -> role, else the name's
/// prefix before `/` (`node2/faults` -> `node2`), else the name.
std::string role_of(const std::string& name) {
  auto dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0)
    return name.substr(0, dot);
  return name.substr(0, name.find('/'));
}

/// Adds the mark (t, total) when the total moved, and drops marks older than the newest one at
/// least `window` old.
void add_mark(std::vector<std::pair<double, double>>& marks, double t, double total,
              double window) {
  if (marks.empty() || marks.back().second != total)
    marks.emplace_back(t, total);
  while (marks.size() > 1 && marks[1].first <= t - window)
    marks.erase(marks.begin());
}

/// The rate over the window ending at `now` from marks kept by `add_mark`: from the oldest mark
/// (at least a window old, else the first, taken at its own time) to `total` now.
double rate_of(const std::vector<std::pair<double, double>>& marks, double now, double total,
               double window) {
  if (marks.empty())
    return 0;
  auto& m = marks.front();
  auto span = m.first <= now - window ? window : now - m.first;
  if (!(span > 0))
    return 0;
  return std::max(0.0, (total - m.second) / span);
}

} // namespace

snapshot::snapshot() : loss(std::numeric_limits<double>::quiet_NaN()) {
  // nop
}

snapshot_builder::snapshot_builder(run_description run, builder_options opts)
    : opts_(opts), ledger_(ledger_options{opts.max_ledger_rows}) {
  cur_.run = std::move(run);
  for (auto& m : cur_.run.members) {
    if (cur_.members.size() >= opts_.max_members)
      break;
    member_state s;
    s.name = m.name;
    s.role = m.role;
    s.node = m.node;
    index_.emplace(s.name, cur_.members.size());
    cur_.members.push_back(std::move(s));
    cur_.live_by_role[m.role] = 0;
  }
  cur_.rounds_by_outcome["averaged"] = 0;
  cur_.rounds_by_outcome["alone"] = 0;
  // The SWARM trainers' tags, as the trainers derive them from the same plan.
  std::vector<std::string> trainers;
  for (auto& m : cur_.run.members)
    if (m.type == "swarm.trainer")
      trainers.push_back(m.name);
  if (!trainers.empty())
    ledger_.set_trainers(trainers);
}

member_state* snapshot_builder::member(const std::string& name) {
  auto i = index_.find(name);
  return i == index_.end() ? nullptr : &cur_.members[i->second];
}

member_state* snapshot_builder::stage_peer(const std::string& source) {
  // s<digits>p<digits>g<digits>, nothing else.
  size_t at = 0;
  auto digits = [&](char tag, uint64_t& out) {
    if (at >= source.size() || source[at] != tag)
      return false;
    size_t from = ++at;
    out = 0;
    while (at < source.size() && at - from < 9 && source[at] >= '0' && source[at] <= '9')
      out = out * 10 + static_cast<uint64_t>(source[at++] - '0');
    return at > from;
  };
  uint64_t stage = 0, slot = 0, gen = 0;
  if (!digits('s', stage) || !digits('p', slot) || !digits('g', gen) || at != source.size())
    return nullptr;
  for (auto& pm : cur_.run.members) {
    if (pm.type != "swarm.stage" || pm.name != pm.role + "." + std::to_string(slot))
      continue;
    auto* m = member(pm.name);
    if (m)
      m->detail = "stage " + std::to_string(stage);
    return m;
  }
  return nullptr;
}

void snapshot_builder::bump(std::map<std::string, uint64_t>& m, const std::string& key,
                            size_t cap) {
  auto i = m.find(key);
  if (i != m.end()) {
    i->second++;
    return;
  }
  // "other" is one of the `cap` series.
  if (m.size() + 1 < cap && key != "other")
    m[key] = 1;
  else
    m["other"]++;
}

void snapshot_builder::set_node_live(const std::string& node, bool live) {
  for (auto& pm : cur_.run.members)
    if ("node" + std::to_string(pm.node) == node)
      down_[pm.name] = !live;
}

void snapshot_builder::add_samples(const std::string& peer, double n, double t) {
  if (!std::isfinite(n) || n <= 0)
    return;
  cur_.samples_total += n;
  auto i = cur_.peer_samples_total.find(peer);
  if (i != cur_.peer_samples_total.end())
    i->second += n;
  else if (cur_.peer_samples_total.size() < opts_.max_peers && peer != "other")
    cur_.peer_samples_total[peer] = n;
  else
    cur_.peer_samples_total["other"] += n;
  if (auto* m = member(peer))
    m->samples += n;
  marks_.emplace_back(t, cur_.samples_total);
}

void snapshot_builder::add(const event_view& e) {
  auto t = std::isfinite(e.t) ? e.t : cur_.run_time_s;
  advance(t);
  ledger_.add(e);
  cur_.events_total++;
  bump(cur_.events_by_kind, e.kind, opts_.max_kinds);
  auto* m = member(e.source);
  if (!m)
    m = stage_peer(e.source);
  // An instance outside the plan joins the list when it is named `<role>.<index>` after a
  // planned role (a volunteer, a respawn), or any role when the plan lists none, within the
  // bounds. Host services (`node2/faults`) and a role's internal names (a stage peer's
  // `s1p2g0`) are not instances: their events count, they are not listed.
  if (!m && cur_.members.size() < opts_.max_members && e.source.find('/') == std::string::npos &&
      !e.source.empty()) {
    auto role = role_of(e.source);
    bool planned_role = cur_.live_by_role.count(role) > 0;
    bool open = cur_.run.members.empty() && cur_.live_by_role.size() < opts_.max_kinds;
    if (planned_role || open) {
      member_state s;
      s.name = e.source;
      s.role = role;
      cur_.live_by_role.emplace(role, 0);
      index_[s.name] = cur_.members.size();
      cur_.members.push_back(std::move(s));
      m = &cur_.members.back();
    }
  }
  if (m)
    m->last_seen_s = t;
  auto loss_point = [&](double loss) { add_loss(t, loss); };
  if (e.kind == "microbatch") {
    cur_.microbatches_total++;
    auto retries = value_of(e, "retries", 0);
    if (std::isfinite(retries) && retries > 0)
      cur_.retries_total += static_cast<uint64_t>(retries);
    add_samples(e.source, value_of(e, "samples", 0), t);
    loss_point(value_of(e, "loss", std::nan("")));
  } else if (e.kind == "dp_step") {
    add_samples(e.source, value_of(e, "samples", 0), t);
    cur_.rounds_by_outcome[value_of(e, "averaged", 0) > 0 ? "averaged" : "alone"]++;
    auto step = value_of(e, "step", -1);
    if (std::isfinite(step))
      cur_.global_step = std::max(cur_.global_step, step);
    loss_point(value_of(e, "loss", std::nan("")));
  } else if (e.kind == "step") {
    // A SWARM stage peer's global step: averaged with its stage's peers or taken on its own.
    auto basis = value_of(e, "averaged", 0) > 0 ? "averaged" : "alone";
    cur_.rounds_by_outcome[basis]++;
    auto step = value_of(e, "step", -1);
    if (std::isfinite(step))
      cur_.global_step = std::max(cur_.global_step, step);
  } else if (e.kind == "dp_dropped") {
    auto n = value_of(e, "samples", 0);
    if (std::isfinite(n) && n > 0)
      cur_.dropped_samples_total += n;
  } else if (e.kind == "dp_join") {
    cur_.joins_total++;
    down_[e.source] = false;
    if (auto& mode = label_of(e, "mode"); m && (mode == "client" || mode == "full"))
      m->detail = mode + " mode";
  } else if (e.kind == "dp_leave") {
    cur_.leaves_total++;
    down_[e.source] = true;
  } else if (e.kind == "fault") {
    auto& action = label_of(e, "action");
    bump(cur_.faults_by_action, action.empty() ? "unknown" : action, opts_.max_kinds);
    if (auto& inst = label_of(e, "instance"); !inst.empty())
      down_[inst] = true;
    else if (action == "kill_node")
      set_node_live(label_of(e, "node"), false);
    if (action == "ban") {
      // The authority revoked the node's token: every instance of it is out of the run.
      auto& node = label_of(e, "node");
      set_node_live(node, false);
      for (auto& pm : cur_.run.members)
        if ("node" + std::to_string(pm.node) == node)
          ledger_.ban(pm.name, "its node (" + node + ") was banned by the run's authority");
    }
  } else if (e.kind == "node_banned") {
    // The authority's reason for a ban (a simulated world's, which the page alone sees).
    auto& node = label_of(e, "node");
    auto& reason = label_of(e, "reason");
    for (auto& pm : cur_.run.members)
      if ("node" + std::to_string(pm.node) == node)
        ledger_.ban(pm.name, "its node (" + node + ") was banned by the run's authority: "
                               + (reason.empty() ? std::string{"no reason given"} : reason));
  } else if (e.kind == "restart") {
    cur_.restarts_total++;
    down_[e.source] = false;
    if (m)
      m->restarts++;
  } else if (e.kind == "restart_node") {
    cur_.restarts_total++;
    set_node_live(label_of(e, "node"), true);
  } else if (e.kind == "refused") {
    auto& reason = label_of(e, "reason");
    bump(cur_.refusals_by_reason, reason.empty() ? "unknown" : reason, opts_.max_reasons);
    // An envelope refused from a node (`from_node`, when the refusing side knows it) counts on
    // each of that node's instances: the envelope does not say which of them sent it.
    if (auto& from = label_of(e, "from_node"); !from.empty() && label_of(e, "peer").empty())
      for (auto& pm : cur_.run.members)
        if ("node" + std::to_string(pm.node) == from)
          ledger_.refuse(pm.name);
  }
}

void snapshot_builder::add_loss(double t, double loss) {
  if (!std::isfinite(loss))
    return;
  cur_.loss = loss;
  if (curve_seen_++ % curve_stride_ != 0)
    return;
  cur_.loss_curve.emplace_back(t, loss);
  if (cur_.loss_curve.size() > opts_.max_curve_points) {
    // Keep every other point and halve the rate of new ones: the curve stays bounded and
    // evenly thinned over the whole run.
    std::vector<std::pair<double, double>> kept;
    for (size_t i = 0; i < cur_.loss_curve.size(); i += 2)
      kept.push_back(cur_.loss_curve[i]);
    cur_.loss_curve = std::move(kept);
    curve_stride_ *= 2;
  }
}

void snapshot_builder::fold_summaries(double now) {
  if (cur_.run.start_unix_s > 0 && std::isfinite(now))
    advance(now - cur_.run.start_unix_s);
  auto t = cur_.run_time_s;
  double samples = 0, loss_sum = 0;
  size_t losses = 0;
  for (auto& r : ledger_.rows()) {
    if (std::isfinite(r.step) && r.step >= 0)
      cur_.global_step = std::max(cur_.global_step, r.step);
    // A stage peer's samples are its trainers' again: the run's samples are the others'.
    if (r.stage >= 0)
      continue;
    samples += r.computed;
    auto i = cur_.peer_samples_total.find(r.peer);
    if (i != cur_.peer_samples_total.end())
      i->second = std::max(i->second, r.computed);
    else if (cur_.peer_samples_total.size() < opts_.max_peers && r.peer != "other")
      cur_.peer_samples_total[r.peer] = r.computed;
    if (auto* m = member(r.peer))
      m->samples = std::max(m->samples, r.computed);
    if (std::isfinite(r.loss) && r.record == "live") {
      loss_sum += r.loss;
      ++losses;
    }
  }
  if (samples > cur_.samples_total) {
    cur_.samples_total = samples;
    marks_.emplace_back(t, samples);
  }
  // Each peer's latest loss, averaged: one point per read.
  if (losses > 0)
    add_loss(t, loss_sum / static_cast<double>(losses));
}

void snapshot_builder::advance(double t) {
  if (std::isfinite(t) && t > cur_.run_time_s)
    cur_.run_time_s = t;
}

void snapshot_builder::finish() {
  cur_.finished = true;
}

void snapshot_builder::set_gate_refusals(const gate_refusals& g) {
  for (auto& [reason, n] : g.by_reason) {
    auto i = gate_reasons_.find(reason);
    if (i == gate_reasons_.end()) {
      if (gate_reasons_.size() >= opts_.max_reasons || reason.empty() || reason.size() > 64)
        continue;
      i = gate_reasons_.emplace(reason, 0).first;
    }
    i->second = std::max(i->second, n);
  }
  ledger_.set_gate_refusals(g.peers);
}

ledger_read_stats snapshot_builder::add_ledger_records(const std::vector<ledger_entry>& entries,
                                                       double now) {
  auto r = ledger_.add_records(entries, now);
  // A node without the metric stream (any but node 0 in a cluster) draws its tiles and loss
  // curve from the summaries.
  if (cur_.events_total == 0)
    fold_summaries(now);
  return r;
}

snapshot snapshot_builder::make() {
  auto now = cur_.run_time_s;
  // The rate over the window: samples since the newest mark at least a window old.
  while (marks_.size() > 1 && marks_[1].first <= now - opts_.rate_window_s)
    marks_.erase(marks_.begin());
  if (!marks_.empty() && marks_.front().first <= now - opts_.rate_window_s)
    cur_.samples_per_second = (cur_.samples_total - marks_.front().second) / opts_.rate_window_s;
  else if (now > 0)
    cur_.samples_per_second = cur_.samples_total / std::min(now, opts_.rate_window_s);
  else
    cur_.samples_per_second = 0;
  for (auto& [role, n] : cur_.live_by_role)
    n = 0;
  std::map<std::string, const planned_member*> plan;
  for (auto& pm : cur_.run.members)
    plan[pm.name] = &pm;
  for (auto& m : cur_.members) {
    auto down = down_.find(m.name);
    bool live = down == down_.end() ? true : !down->second;
    if (auto p = plan.find(m.name); p != plan.end()) {
      if (now < p->second->start_s || (p->second->leave_s >= 0 && now >= p->second->leave_s))
        live = false;
    }
    m.live = live && !cur_.finished;
    if (m.live)
      cur_.live_by_role[m.role]++;
    else
      cur_.live_by_role.emplace(m.role, 0);
  }
  // Data-parallel peers by the mode their join said (`full mode`, `client mode`).
  for (auto& [mode, n] : cur_.live_by_mode)
    n = 0;
  for (auto& m : cur_.members)
    for (const char* mode : {"full", "client"})
      if (m.detail == std::string{mode} + " mode") {
        cur_.live_by_mode.emplace("full", 0);
        cur_.live_by_mode.emplace("client", 0);
        if (m.live)
          cur_.live_by_mode[mode]++;
      }
  cur_.ledger = ledger_.rows();
  // Bytes per peer and bans, from the ledger's rows (each only grows): sticky labels, the rest
  // under "other"; counters, so never below what they showed.
  {
    std::map<std::string, double> sent, received;
    uint64_t banned = 0;
    double accepted = 0;
    size_t named = cur_.peer_bytes_sent_total.size() - cur_.peer_bytes_sent_total.count("other");
    for (auto& r : cur_.ledger) {
      banned += r.banned ? 1 : 0;
      accepted += std::isfinite(r.accepted) && r.accepted > 0 ? r.accepted : 0.0;
      auto label = r.peer;
      if (label != "other" && cur_.peer_bytes_sent_total.count(label) == 0) {
        if (named >= opts_.max_peers) {
          label = "other";
        } else {
          cur_.peer_bytes_sent_total.emplace(label, 0.0);
          ++named;
        }
      }
      sent[label] += r.bytes_sent;
      received[label] += r.bytes_received;
    }
    for (auto& [label, v] : sent) {
      auto& x = cur_.peer_bytes_sent_total[label];
      x = std::max(x, v);
    }
    for (auto& [label, v] : received) {
      auto& x = cur_.peer_bytes_received_total[label];
      x = std::max(x, v);
    }
    cur_.bans_total = std::max(cur_.bans_total, banned);
    cur_.samples_accepted_total = std::max(cur_.samples_accepted_total, accepted);
  }
  for (auto& [peer, total] : cur_.peer_samples_total) {
    auto& marks = peer_marks_[peer];
    add_mark(marks, now, total, opts_.rate_window_s);
    cur_.peer_samples_per_second[peer] = rate_of(marks, now, total, opts_.rate_window_s);
  }
  // Per stage: the samples its peers applied (computed less dropped, their summaries' claims of
  // their own work), summed; a counter, so never below what it showed.
  std::map<std::string, double> stages;
  for (auto& r : cur_.ledger)
    if (r.stage >= 0)
      stages[std::to_string(r.stage)] += std::max(0.0, r.computed - r.dropped);
  for (auto& [stage, total] : stages) {
    auto i = cur_.stage_samples_total.find(stage);
    if (i == cur_.stage_samples_total.end()) {
      if (cur_.stage_samples_total.size() >= opts_.max_stages)
        continue;
      i = cur_.stage_samples_total.emplace(stage, 0.0).first;
    }
    i->second = std::max(i->second, total);
  }
  for (auto& [stage, total] : cur_.stage_samples_total) {
    auto& marks = stage_marks_[stage];
    add_mark(marks, now, total, opts_.stage_rate_window_s);
    cur_.stage_samples_per_second[stage] = rate_of(marks, now, total, opts_.stage_rate_window_s);
  }
  auto out = cur_;
  out.version = next_version_++;
  // The stream's refusals (a simulated world's, refused metrics) and the gate's.
  for (auto& [reason, n] : gate_reasons_)
    if (n > 0)
      out.refusals_by_reason[reason] += n;
  return out;
}

snapshot_store::snapshot_store() : cur_(std::make_shared<const snapshot>()) {
  // nop
}

void snapshot_store::publish(snapshot s) {
  auto p = std::make_shared<const snapshot>(std::move(s));
  std::lock_guard<std::mutex> guard{mtx_};
  cur_ = std::move(p);
}

std::shared_ptr<const snapshot> snapshot_store::current() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return cur_;
}

} // namespace starling::runtime::observe
