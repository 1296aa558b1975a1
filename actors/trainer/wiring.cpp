#include "actors/trainer/wiring.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace starling::actors::trainer {

namespace {

using measured_list = std::vector<std::pair<const std::string*, double>>;

measured_list::iterator measured_at(measured_list& xs, const std::string& id) {
  return std::lower_bound(xs.begin(), xs.end(), id,
                          [](const auto& x, const std::string& n) { return *x.first < n; });
}

} // namespace

void throughput_ema::add(double sample) {
  raw_ = (1.0 - alpha_) * raw_ + alpha_ * sample;
  decay_ *= 1.0 - alpha_;
  ++count_;
}

double throughput_ema::value() const noexcept {
  if (count_ == 0)
    return 0.0;
  return raw_ / (1.0 - decay_);
}

int64_t inflight_target(size_t peers_seen, int64_t trainers, double per_peer, int64_t cap,
                        int64_t fallback) {
  if (!(per_peer > 0) || peers_seen == 0 || trainers <= 0)
    return fallback;
  auto want = std::ceil(per_peer * static_cast<double>(peers_seen) / static_cast<double>(trainers));
  auto top = static_cast<double>(std::max<int64_t>(1, cap));
  return static_cast<int64_t>(std::clamp(want, 1.0, top));
}

wiring_policy::wiring_policy(size_t stages, wiring_options opts)
  : opts_(opts), stages_(stages), rng_(opts.seed) {}

double wiring_policy::min_load(const stage_state& s) const {
  if (!s.ready.empty())
    return s.ready.front().load;
  // Nobody is ready: fall back to the least loaded peer overall, so a returning peer does not
  // undercut the others' history.
  double m = std::numeric_limits<double>::infinity();
  for (auto& [id, p] : s.peers)
    m = std::min(m, p.load);
  return std::isfinite(m) ? m : 0.0;
}

void wiring_policy::add_peer(size_t stage, const std::string& peer) {
  auto& s = stages_.at(stage);
  if (s.peers.count(peer))
    return;
  auto load = min_load(s);
  if (opts_.seed != 0)
    load += std::uniform_real_distribution<double>{0.0, opts_.tie_break}(rng_);
  peer_state p{load, throughput_ema{opts_.alpha}, throughput_ema{opts_.alpha}, {}};
  auto it = s.peers.emplace(peer, std::move(p)).first;
  // The list borrows the map's copy of the name (map nodes do not move).
  s.ready.insert(it->second.load, it->first, false, 0.0);
  s.mean_forward.reset();
}

void wiring_policy::remove_peer(size_t stage, const std::string& peer) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end())
    return;
  s.ready.erase(it->second.load, peer);
  if (it->second.excluded_until)
    s.excluded.erase({*it->second.excluded_until, peer});
  if (auto m = measured_at(s.measured, peer); m != s.measured.end() && *m->first == peer)
    s.measured.erase(m);
  s.peers.erase(it);
  s.mean_forward.reset();
}

void wiring_policy::refresh(size_t stage, const std::vector<std::string>& peers) {
  auto& s = stages_.at(stage);
  std::set<std::string> wanted(peers.begin(), peers.end());
  std::vector<std::string> gone;
  for (auto& [id, p] : s.peers)
    if (!wanted.count(id))
      gone.push_back(id);
  for (auto& id : gone)
    remove_peer(stage, id);
  for (auto& id : peers)
    add_peer(stage, id);
}

double wiring_policy::mean_forward(const stage_state& s) const {
  if (!s.mean_forward) {
    double sum = 0.0;
    int n = 0;
    for (auto& [id, v] : s.measured) {
      sum += v;
      ++n;
    }
    s.mean_forward = n > 0 ? sum / n : opts_.default_throughput;
  }
  return *s.mean_forward;
}

double wiring_policy::expected_seconds(const stage_state& s, const peer_state& p, pass dir,
                                       double samples) const {
  // An unmeasured peer is assumed as fast as the stage's measured peers on average.
  double forward = p.forward.measured() ? p.forward.value() : mean_forward(s);
  if (dir == pass::forward)
    return samples / forward;
  if (p.backward.measured())
    return samples / p.backward.value();
  return opts_.backward_factor * samples / forward;
}

void wiring_policy::readmit_expired(stage_state& s, double now) {
  if (s.excluded.empty() || s.excluded.begin()->first > now)
    return;
  std::vector<std::string> due;
  while (!s.excluded.empty() && s.excluded.begin()->first <= now) {
    due.push_back(s.excluded.begin()->second);
    s.excluded.erase(s.excluded.begin());
  }
  // In name order: each one re-enters at the minimum the previous ones left.
  std::sort(due.begin(), due.end());
  for (auto& id : due) {
    auto it = s.peers.find(id);
    auto& p = it->second;
    p.excluded_until.reset();
    // Re-enter at the current minimum: its load did not grow while excluded, and it should not
    // get a burst of requests for that.
    p.load = std::max(p.load, min_load(s));
    s.ready.insert(p.load, it->first, p.forward.measured(), p.forward.value());
  }
}

std::optional<std::string> wiring_policy::peek(size_t stage, double now) {
  auto& s = stages_.at(stage);
  readmit_expired(s, now);
  if (s.ready.empty())
    return std::nullopt;
  return *s.ready.front().id;
}

std::optional<std::string> wiring_policy::pick(size_t stage, pass dir, double samples, double now) {
  auto id = peek(stage, now);
  if (id)
    charge(stage, *id, dir, samples);
  return id;
}

std::vector<std::string> wiring_policy::sample(size_t stage, double now, size_t count) {
  std::vector<std::string> out;
  auto first = peek(stage, now);
  if (!first || count == 0)
    return out;
  out.push_back(*first);
  auto& s = stages_.at(stage);
  // The other ready peers, weighted by their estimated forward throughput.
  // As 1.0 / expected_seconds(s, p, pass::forward, 1.0) per peer: the throughput a measured
  // peer keeps in the list, the stage's mean (computed once) for the others.
  auto unmeasured = 1.0 / (1.0 / mean_forward(s));
  auto first_id = s.ready.front().id;
  std::vector<std::pair<const std::string*, double>> pool;
  pool.reserve(s.ready.size());
  for (auto& e : s.ready.entries())
    if (e.id != first_id)
      pool.emplace_back(e.id, e.has_value ? 1.0 / (1.0 / e.value) : unmeasured);
  while (out.size() < count && !pool.empty()) {
    double total = 0;
    for (auto& [id, w] : pool)
      total += w;
    auto x = std::uniform_real_distribution<double>{0.0, total}(rng_);
    size_t k = 0;
    for (; k + 1 < pool.size(); ++k) {
      x -= pool[k].second;
      if (x < 0)
        break;
    }
    out.push_back(*pool[k].first);
    pool.erase(pool.begin() + static_cast<long>(k));
  }
  return out;
}

void wiring_policy::add_load(size_t stage, const std::string& peer, double delta) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end() || it->second.excluded_until)
    return;
  auto& p = it->second;
  auto floor = delta < 0 ? min_load(s) : -std::numeric_limits<double>::infinity();
  auto old = p.load;
  p.load = std::max(p.load + delta, std::min(floor, p.load));
  if (!s.ready.reload(old, peer, p.load))
    s.ready.insert(p.load, it->first, p.forward.measured(), p.forward.value());
}

void wiring_policy::charge(size_t stage, const std::string& peer, pass dir, double samples) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end())
    return;
  add_load(stage, peer, expected_seconds(s, it->second, dir, samples));
}

void wiring_policy::refund(size_t stage, const std::string& peer, pass dir, double samples) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end())
    return;
  add_load(stage, peer, -expected_seconds(s, it->second, dir, samples));
}

size_t wiring_policy::peer_count() const {
  size_t n = 0;
  for (auto& s : stages_)
    n += s.peers.size();
  return n;
}

void wiring_policy::report_success(size_t stage, const std::string& peer, pass dir, double samples,
                                   double seconds) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end() || !(seconds > 0.0) || !(samples > 0.0))
    return;
  auto& p = it->second;
  (dir == pass::forward ? p.forward : p.backward).add(samples / seconds);
  if (dir == pass::forward) {
    auto m = measured_at(s.measured, peer);
    if (m != s.measured.end() && *m->first == peer)
      m->second = p.forward.value();
    else
      s.measured.emplace(m, &it->first, p.forward.value());
    s.mean_forward.reset();
    if (!p.excluded_until)
      s.ready.set_value(p.load, it->first, true, p.forward.value());
  }
}

void wiring_policy::exclude(size_t stage, const std::string& peer, double until) {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end())
    return;
  auto& p = it->second;
  if (!p.excluded_until)
    s.ready.erase(p.load, peer);
  else
    s.excluded.erase({*p.excluded_until, peer});
  p.excluded_until = std::max(until, p.excluded_until.value_or(until));
  s.excluded.emplace(*p.excluded_until, peer);
}

bool wiring_policy::excluded(size_t stage, const std::string& peer, double now) const {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  return it != s.peers.end() && it->second.excluded_until && *it->second.excluded_until > now;
}

std::optional<double> wiring_policy::throughput(size_t stage, const std::string& peer,
                                                pass dir) const {
  auto& s = stages_.at(stage);
  auto it = s.peers.find(peer);
  if (it == s.peers.end())
    return std::nullopt;
  return 1.0 / expected_seconds(s, it->second, dir, 1.0);
}

std::vector<std::string> wiring_policy::peers(size_t stage) const {
  std::vector<std::string> out;
  for (auto& [id, p] : stages_.at(stage).peers)
    out.push_back(id);
  return out;
}

} // namespace starling::actors::trainer
