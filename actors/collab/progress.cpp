#include "actors/collab/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

namespace starling::actors::collab {

namespace {

constexpr uint8_t progress_version = 1;
constexpr uint8_t flag_client = 1;
constexpr uint8_t flag_withdrawn = 2;
constexpr uint8_t flag_resync = 4;
constexpr uint8_t known_flags = flag_client | flag_withdrawn | flag_resync;
// version, flags, step, samples, rate, time, id length.
constexpr size_t fixed_bytes = 1 + 1 + 8 + 8 + 8 + 8 + 1;

void put_u64(std::vector<char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_f64(std::vector<char>& out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, 8);
  put_u64(out, bits);
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

double get_f64(const char* p) {
  auto bits = get_u64(p);
  double v = 0;
  std::memcpy(&v, &bits, 8);
  return v;
}

} // namespace

std::vector<char> encode_progress(const progress_record& r) {
  std::vector<char> out;
  auto id = r.peer.substr(0, max_peer_id_bytes);
  out.reserve(fixed_bytes + id.size());
  out.push_back(static_cast<char>(progress_version));
  uint8_t flags = (r.client_mode ? flag_client : 0) | (r.withdrawn ? flag_withdrawn : 0) |
                  (r.resync ? flag_resync : 0);
  out.push_back(static_cast<char>(flags));
  put_u64(out, r.step);
  put_u64(out, r.samples);
  put_f64(out, r.rate);
  put_f64(out, r.time);
  out.push_back(static_cast<char>(id.size()));
  out.insert(out.end(), id.begin(), id.end());
  return out;
}

result<progress_record> decode_progress(const std::vector<char>& bytes) {
  if (bytes.size() < fixed_bytes)
    return fail(fmt::format("progress record of {} bytes, expected at least {}", bytes.size(),
                            fixed_bytes));
  const char* p = bytes.data();
  auto version = static_cast<uint8_t>(p[0]);
  if (version != progress_version)
    return fail(fmt::format("progress record version {}, expected {}", version, progress_version));
  auto flags = static_cast<uint8_t>(p[1]);
  if ((flags & ~known_flags) != 0)
    return fail(fmt::format("progress record flags {:#x} carry unknown bits", flags));
  progress_record r;
  r.client_mode = (flags & flag_client) != 0;
  r.withdrawn = (flags & flag_withdrawn) != 0;
  r.resync = (flags & flag_resync) != 0;
  r.step = get_u64(p + 2);
  r.samples = get_u64(p + 10);
  r.rate = get_f64(p + 18);
  r.time = get_f64(p + 26);
  auto id_len = static_cast<size_t>(static_cast<uint8_t>(p[34]));
  if (id_len == 0 || id_len > max_peer_id_bytes)
    return fail(fmt::format("progress record peer id of {} bytes, expected 1 to {}", id_len,
                            max_peer_id_bytes));
  if (bytes.size() != fixed_bytes + id_len)
    return fail(fmt::format("progress record of {} bytes, its peer id length says {}", bytes.size(),
                            fixed_bytes + id_len));
  if (r.samples > max_record_samples)
    return fail(fmt::format("progress record claims {} samples, at most 2^53 allowed", r.samples));
  if (!std::isfinite(r.rate) || r.rate < 0 || r.rate > max_record_rate)
    return fail(fmt::format("progress record rate {} is not in [0, {}]", r.rate, max_record_rate));
  if (!std::isfinite(r.time))
    return fail("progress record time is not finite");
  r.peer.assign(p + fixed_bytes, id_len);
  return r;
}

status validate(const progress_options& o) {
  if (o.target_batch == 0)
    return fail("target_batch must be positive, got 0");
  if (!(o.min_refresh > 0) || !(o.max_refresh >= o.min_refresh) || !std::isfinite(o.max_refresh))
    return fail(fmt::format("refresh bounds must satisfy 0 < min_refresh <= max_refresh, got "
                            "[{}, {}]",
                            o.min_refresh, o.max_refresh));
  if (!(o.expected_drift_peers >= 0) || !(o.expected_drift_rate >= 0))
    return fail(fmt::format("expected drifts must be >= 0, got peers {} and rate {}",
                            o.expected_drift_peers, o.expected_drift_rate));
  if (!(o.record_lifetime > 0) || !std::isfinite(o.record_lifetime))
    return fail(fmt::format("record_lifetime must be positive, got {}", o.record_lifetime));
  return {};
}

seconds refresh_period(seconds eta, size_t peers, const progress_options& o) {
  if (!std::isfinite(eta))
    return o.max_refresh;
  auto n = static_cast<double>(std::max<size_t>(peers, 1));
  auto expected = std::max(n + o.expected_drift_peers, (1 + o.expected_drift_rate) * n);
  auto period = std::max(eta, 0.0) * n / std::max(expected, 1.0);
  return std::clamp(period, o.min_refresh, o.max_refresh);
}

progress_estimate estimate_progress(const std::vector<held_record>& others, const std::string& self,
                                    uint64_t step, uint64_t own_samples, double own_rate,
                                    seconds now, const progress_options& o) {
  progress_estimate e;
  e.step = step;
  e.samples = static_cast<double>(own_samples);
  e.rate = std::max(own_rate, 0.0);
  e.peers = 1;
  e.unmeasured = e.rate > 0 ? 0 : 1;
  for (const auto& h : others) {
    const auto& r = h.record;
    if (r.peer == self || r.withdrawn || now >= h.expires_at)
      continue;
    if (r.step == step) {
      // A record from a clock ahead of ours extrapolates nothing rather than negatively.
      e.samples += static_cast<double>(r.samples) + r.rate * std::max(0.0, now - r.time);
      e.rate += r.rate;
      e.peers++;
      if (!(r.rate > 0))
        e.unmeasured++;
    } else if (r.step > step) {
      e.ahead.push_back({r.peer, r.step, r.client_mode});
    } else {
      e.behind++;
    }
  }
  std::sort(e.ahead.begin(), e.ahead.end(), [](const ahead_peer& a, const ahead_peer& b) {
    return a.step > b.step || (a.step == b.step && a.peer < b.peer);
  });
  auto target = static_cast<double>(o.target_batch);
  e.reached = e.samples >= target;
  if (e.reached)
    e.eta = 0;
  else if (e.rate > 0)
    e.eta = (target - e.samples) / e.rate;
  else
    e.eta = std::numeric_limits<double>::infinity();
  e.eta_at = now + e.eta;
  // The next read: peers whose rate is not measured yet (a record published before its peer's
  // second microbatch) may go as fast as the measured ones, so the refresh comes by the ETA they
  // would make then. Counted at rate 0 a whole collaboration that started together read its
  // first records at rate 0, then waited ETA·N / 1.2N on the own rate alone (64 peers: 10.6 s
  // for a step of 0.2 s) while the few that read early stepped and sent the rest downloading.
  auto measured = e.peers - e.unmeasured;
  auto eta = e.eta;
  if (!e.reached && e.unmeasured > 0 && measured > 0 && e.rate > 0) {
    auto rate = e.rate * static_cast<double>(e.peers) / static_cast<double>(measured);
    eta = (target - e.samples) / rate;
  }
  e.refresh_in = refresh_period(eta, e.peers, o);
  return e;
}

progress_tracker::progress_tracker(std::string self, progress_options opts)
    : self_(std::move(self)), opts_(opts) {
  // The view starts empty: nothing is known until the first read.
}

read_summary progress_tracker::observe(const std::vector<progress_entry>& entries, seconds now) {
  read_summary s;
  std::vector<held_record> view;
  std::vector<std::string> tombstones;
  for (const auto& e : entries) {
    auto r = decode_progress(e.value);
    if (!r || r->peer != e.subkey) {
      s.rejected++;
      continue;
    }
    if (r->withdrawn) {
      s.withdrawn++;
      tombstones.push_back(r->peer);
      continue;
    }
    if (r->peer == self_ || now >= e.expires_at)
      continue;
    // One record per peer: a DHT read holds one per sub-key, but several reads may be merged.
    auto same = std::find_if(view.begin(), view.end(),
                             [&](const held_record& h) { return h.record.peer == r->peer; });
    if (same != view.end()) {
      if (r->time > same->record.time) {
        auto made = r->time;
        *same = held_record{std::move(*r), e.expires_at, false, made};
      }
      continue;
    }
    auto made = r->time;
    view.push_back(held_record{std::move(*r), e.expires_at, false, made});
    s.accepted++;
  }
  // A presumed record stays over the peer's own record from before the step it presumes.
  std::unordered_map<std::string_view, const held_record*> presumed;
  for (const auto& h : records_)
    if (h.presumed)
      presumed.emplace(h.record.peer, &h);
  for (auto& h : view) {
    auto it = presumed.find(h.record.peer);
    if (it == presumed.end())
      continue;
    const auto* held = it->second;
    if (h.record.step < held->record.step && h.record.time <= held->record.time) {
      // Records are published less often than fast steps come: the presumption is carried
      // from step to step, and takes the rate of each newer record meanwhile.
      // A newer record that shows samples accumulated also keeps the presumption alive as long
      // as itself: the peer is at work, only behind the steps presumed for it. One that shows
      // none (an idle peer, or one that just stepped) leaves the expiry where it was, so that
      // peers whose work stopped are not presumed at it for a record lifetime after each step.
      // Kept to the first record's expiry, 61 of 64 peers that started together emptied their
      // views at once one lifetime after the start and downloaded the state.
      auto fresher = h.record.time > held->rate_time;
      auto rate = h.record.rate;
      auto rate_time = h.record.time;
      auto at_work = fresher && h.record.samples > 0;
      auto expires_at = h.expires_at;
      h = *held;
      if (fresher) {
        h.record.rate = rate;
        h.rate_time = rate_time;
      }
      if (at_work)
        h.expires_at = std::max(h.expires_at, expires_at);
    }
  }
  records_ = std::move(view);
  // A tombstone wins over a live record of the same peer from another (merged) read.
  for (const auto& peer : tombstones)
    forget(peer);
  return s;
}

void progress_tracker::forget(const std::string& peer) {
  records_.erase(std::remove_if(records_.begin(), records_.end(),
                                [&](const held_record& h) { return h.record.peer == peer; }),
                 records_.end());
}

void progress_tracker::presume_stepped(uint64_t step, seconds now) {
  for (auto& h : records_) {
    auto& r = h.record;
    if (r.step != step || r.withdrawn)
      continue;
    r.step = step + 1;
    r.samples = 0;
    r.time = now;
    r.resync = false;
    h.presumed = true;
  }
}

progress_estimate progress_tracker::estimate(uint64_t step, uint64_t own_samples, double own_rate,
                                             seconds now) const {
  return estimate_progress(records_, self_, step, own_samples, own_rate, now, opts_);
}

local_progress::local_progress(double alpha) : alpha_(std::clamp(alpha, 1e-6, 1.0)) {
  // Nothing measured yet: the rate is 0 until the first interval closes.
}

void local_progress::add(uint64_t samples, seconds now) {
  samples_ += samples;
  if (!has_mark_) {
    // The work before the first call started at an unknown time: measure from here on.
    has_mark_ = true;
    mark_ = now;
    return;
  }
  since_mark_ += samples;
  if (now <= mark_ || since_mark_ == 0)
    return;
  auto per_sample = (now - mark_) / static_cast<double>(since_mark_);
  ema_seconds_per_sample_ = alpha_ * per_sample + (1 - alpha_) * ema_seconds_per_sample_;
  updates_++;
  mark_ = now;
  since_mark_ = 0;
}

void local_progress::idle(seconds now) {
  has_mark_ = true;
  mark_ = now;
  since_mark_ = 0;
}

uint64_t local_progress::take() {
  auto s = samples_;
  samples_ = 0;
  return s;
}

double local_progress::rate() const {
  if (updates_ == 0)
    return 0;
  // Bias correction: the EMA started at 0, so early values are scaled up to an unbiased mean.
  auto corrected =
      ema_seconds_per_sample_ / (1 - std::pow(1 - alpha_, static_cast<double>(updates_)));
  return corrected > 0 ? 1.0 / corrected : 0;
}

} // namespace starling::actors::collab
