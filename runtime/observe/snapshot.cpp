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
  auto loss_point = [&](double loss) {
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
  };
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
  }
}

void snapshot_builder::advance(double t) {
  if (std::isfinite(t) && t > cur_.run_time_s)
    cur_.run_time_s = t;
}

void snapshot_builder::finish() {
  cur_.finished = true;
}

ledger_read_stats snapshot_builder::add_ledger_records(const std::vector<ledger_entry>& entries,
                                                       double now) {
  return ledger_.add_records(entries, now);
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
  cur_.ledger = ledger_.rows();
  auto out = cur_;
  out.version = next_version_++;
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
