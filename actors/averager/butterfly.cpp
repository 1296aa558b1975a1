#include "actors/averager/butterfly.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/averager/load_balance.hpp"

namespace starling::actors::averager {

std::vector<size_t> round_plan::senders() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < members.size(); ++i)
    if (!members[i].auxiliary)
      out.push_back(i);
  return out;
}

result<round_plan> make_plan(std::vector<member_info> members, int64_t size, int64_t min_part) {
  if (members.empty())
    return fail("an averaging group needs at least one member");
  if (size < 0)
    return fail(fmt::format("vector size must be >= 0, got {}", size));
  std::vector<double> bw;
  bool any_sender = false;
  for (auto& m : members) {
    bw.push_back(m.bandwidth);
    any_sender = any_sender || !m.auxiliary;
  }
  if (!any_sender)
    return fail(fmt::format("all {} members are auxiliary: nobody contributes data",
                            members.size()));
  round_plan p;
  p.size = size;
  if (size == 0) {
    // Still validate the bandwidths so that a bad group fails the same way for any size.
    auto f = optimal_fractions(bw);
    if (!f)
      return f.error();
    p.sizes.assign(members.size(), 0);
  } else {
    auto parts = balance_parts(bw, size, std::max<int64_t>(1, min_part));
    if (!parts)
      return parts.error();
    p.sizes = std::move(*parts);
  }
  p.offsets.resize(members.size());
  int64_t off = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    p.offsets[i] = off;
    off += p.sizes[i];
  }
  p.members = std::move(members);
  return p;
}

reduce_fn weighted_mean_reducer() {
  // A kept-chunks kernel (the streamed default needs none); the same rules as the streamed one.
  return [](const std::vector<at::Tensor>& xs, const std::vector<double>& ws) {
    return kernels::weighted_mean(xs, ws);
  };
}

reduce_fn centered_clip_reducer(kernels::centered_clip_options options) {
  return [options](const std::vector<at::Tensor>& xs,
                   const std::vector<double>& ws) -> result<at::Tensor> {
    auto r = kernels::centered_clip(xs, ws, options);
    if (!r)
      return r.error();
    return std::move(r->value);
  };
}

// -- range_set ---------------------------------------------------------------------------------

status range_set::check(int64_t lo, int64_t hi) const {
  if (lo >= hi)
    return {};
  // The range starting at or before `lo`, then the one after it.
  auto next = ranges_.upper_bound(lo);
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > lo)
      return fail(fmt::format("[{}, {}) overlaps [{}, {})", lo, hi, prev->first, prev->second));
  }
  if (next != ranges_.end() && next->first < hi)
    return fail(fmt::format("[{}, {}) overlaps [{}, {})", lo, hi, next->first, next->second));
  return {};
}

status range_set::insert(int64_t lo, int64_t hi) {
  if (lo >= hi)
    return {};
  if (auto st = check(lo, hi); !st)
    return st;
  size_ += hi - lo;
  auto next = ranges_.upper_bound(lo);
  // Merge with the neighbours it touches.
  if (next != ranges_.end() && next->first == hi) {
    hi = next->second;
    next = ranges_.erase(next);
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == lo) {
      lo = prev->first;
      ranges_.erase(prev);
    }
  }
  ranges_.emplace(lo, hi);
  return {};
}

bool range_set::covers(int64_t lo, int64_t hi) const {
  if (lo >= hi)
    return true;
  auto it = ranges_.upper_bound(lo);
  if (it == ranges_.begin())
    return false;
  --it;
  return it->first <= lo && it->second >= hi;
}

// -- part_reducer ------------------------------------------------------------------------------

bool append_segment(std::vector<part_segment>& segments, part_segment seg) {
  if (!segments.empty() && segments.back().contributors == seg.contributors
      && segments.back().offset + segments.back().size == seg.offset) {
    segments.back().size += seg.size;
    return false;
  }
  segments.push_back(std::move(seg));
  return true;
}

std::vector<uint32_t> common_contributors(const std::vector<part_segment>& segments) {
  if (segments.empty())
    return {};
  auto out = segments.front().contributors;
  for (size_t i = 1; i < segments.size(); ++i) {
    std::vector<uint32_t> both;
    std::set_intersection(out.begin(), out.end(), segments[i].contributors.begin(),
                          segments[i].contributors.end(), std::back_inserter(both));
    out = std::move(both);
  }
  return out;
}

part_reducer::part_reducer(int64_t part_size, std::vector<size_t> expected, reduce_fn fn,
                           at::Tensor buffer)
  : size_(part_size), fn_(std::move(fn)), acc_(std::move(buffer)) {
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  for (auto p : expected) {
    slot s;
    s.peer = p;
    slots_.push_back(std::move(s));
  }
  if (!acc_.defined() || acc_.scalar_type() != torch::kFloat32 || acc_.dim() != 1
      || acc_.numel() != size_ || !acc_.is_contiguous())
    acc_ = torch::empty({size_}, torch::kFloat32);
}

part_reducer::slot* part_reducer::find(size_t peer) {
  for (auto& s : slots_)
    if (s.peer == peer)
      return &s;
  return nullptr;
}

const part_reducer::slot* part_reducer::find(size_t peer) const {
  for (auto& s : slots_)
    if (s.peer == peer)
      return &s;
  return nullptr;
}

status part_reducer::add(size_t peer, double weight, int64_t offset, const at::Tensor& values,
                         bool finite) {
  if (reduced_)
    return fail(fmt::format("chunk of peer {} after the part was reduced", peer));
  auto* s = find(peer);
  if (s == nullptr)
    return fail(fmt::format("peer {} is not expected to contribute to this part", peer));
  if (s->excluded)
    return fail(fmt::format("peer {} was excluded from this part", peer));
  if (!std::isfinite(weight) || weight < 0)
    return fail(fmt::format("weight of peer {} must be finite and >= 0, got {}", peer, weight));
  if (s->weight >= 0 && s->weight != weight)
    return fail(fmt::format("peer {} changed its weight from {} to {} within a part", peer,
                            s->weight, weight));
  if (!values.defined() || values.dim() != 1 || !values.is_floating_point())
    return fail(fmt::format("chunk of peer {} must be a defined 1-D float tensor", peer));
  auto n = values.numel();
  if (offset < 0 || n > size_ || offset > size_ - n)
    return fail(fmt::format("chunk [{}, {}) of peer {} lies outside the part of {} elements",
                            offset, offset + n, peer, size_));
  if (auto st = s->ranges.check(offset, offset + n); !st)
    return fail(fmt::format("chunk of peer {}: {} it already sent", peer, st.what()));
  if (!finite && !all_finite(values))
    return fail(fmt::format("chunk of peer {} holds non-finite values", peer));
  if (n > 0) {
    if (streaming()) {
      if (weight > 0) {
        auto v = values.to(torch::kFloat32);
        if (!acc_ready_ && n == size_) {
          // The first chunk covers the part: the sum starts as its weighted values.
          if (weight == 1)
            acc_.copy_(v);
          else
            at::mul_out(acc_, v, at::scalar_tensor(weight, torch::kFloat32));
        } else {
          if (!acc_ready_)
            acc_.zero_();
          acc_.narrow(0, offset, n).add_(v, weight);
        }
        acc_ready_ = true;
      }
    } else {
      s->pieces.emplace_back(offset, values.to(torch::kFloat32));
    }
    s->ranges.insert(offset, offset + n); // checked above
  }
  s->weight = weight;
  return {};
}

bool part_reducer::has(size_t peer, int64_t offset, int64_t n) const {
  auto* s = find(peer);
  return s != nullptr && n > 0 && s->ranges.covers(offset, offset + n);
}

void part_reducer::exclude(size_t peer) {
  auto* s = find(peer);
  if (s == nullptr || s->excluded || s->ranges.size() == size_)
    return;
  s->excluded = true;
  if (!streaming()) {
    s->pieces.clear();
    s->ranges.clear();
  }
}

bool part_reducer::complete() const {
  return std::all_of(slots_.begin(), slots_.end(), [this](const slot& s) {
    return s.excluded || (s.weight >= 0 && s.ranges.size() == size_);
  });
}

std::vector<size_t> part_reducer::contributors() const {
  std::vector<size_t> out;
  for (auto& s : slots_)
    if (!s.excluded && s.weight >= 0 && s.ranges.size() == size_)
      out.push_back(s.peer);
  return out;
}

double part_reducer::weight_of(size_t peer) const {
  auto* s = find(peer);
  if (!s || s->excluded || s->weight < 0 || s->ranges.size() != size_)
    return -1;
  return s->weight;
}

at::Tensor part_reducer::assemble(const slot& s) const {
  if (s.pieces.size() == 1 && s.pieces.front().second.is_contiguous())
    return s.pieces.front().second;
  auto t = torch::empty({size_}, torch::kFloat32);
  for (auto& [off, piece] : s.pieces)
    t.narrow(0, off, piece.numel()).copy_(piece);
  return t;
}

result<reduction> part_reducer::reduce() {
  if (reduced_)
    return fail("the part was reduced already");
  reduced_ = true;
  try {
    return streaming() ? reduce_streamed() : reduce_kept();
  } catch (const std::exception& e) {
    return fail(fmt::format("reduction threw: {}", e.what()));
  }
}

result<reduction> part_reducer::reduce_streamed() {
  if (std::none_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.weight >= 0; }))
    return fail("no contribution reached the reducer");
  if (!acc_ready_) {
    acc_.zero_();
    acc_ready_ = true;
  }
  reduction out;
  out.values = acc_;
  if (size_ == 0) {
    part_segment all;
    for (auto& s : slots_)
      if (s.weight >= 0)
        all.contributors.push_back(static_cast<uint32_t>(s.peer));
    out.segments.push_back(std::move(all));
    return out;
  }
  // Elementary segments between every range boundary; each slot covers a segment entirely or
  // not at all.
  std::vector<int64_t> cuts = {0, size_};
  for (auto& s : slots_)
    for (auto& [lo, hi] : s.ranges.ranges()) {
      cuts.push_back(lo);
      cuts.push_back(hi);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<double> totals;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    auto lo = cuts[k];
    part_segment seg;
    seg.offset = lo;
    seg.size = cuts[k + 1] - lo;
    double total = 0;
    for (auto& s : slots_) {
      if (!s.ranges.covers(lo, lo + 1))
        continue;
      seg.contributors.push_back(static_cast<uint32_t>(s.peer));
      total += s.weight;
    }
    if (seg.contributors.empty())
      return fail(fmt::format("no contribution reached elements [{}, {}) of the part", lo,
                              lo + seg.size));
    if (!(total > 0))
      return fail(fmt::format("weighted_mean: the weights sum to 0 on elements [{}, {})", lo,
                              lo + seg.size));
    if (append_segment(out.segments, std::move(seg)))
      totals.push_back(total);
  }
  // Divided by their totals, except where `finish_early` did it already.
  for (size_t k = 0; k < out.segments.size(); ++k) {
    auto lo = out.segments[k].offset;
    auto hi = lo + out.segments[k].size;
    for (auto& [elo, ehi] : early_.ranges()) {
      if (ehi <= lo)
        continue;
      if (elo >= hi)
        break;
      if (elo > lo)
        acc_.narrow(0, lo, elo - lo).div_(totals[k]);
      lo = std::max(lo, ehi);
    }
    if (hi > lo)
      acc_.narrow(0, lo, hi - lo).div_(totals[k]);
  }
  return out;
}

std::optional<part_segment> part_reducer::finish_early(int64_t lo, int64_t hi) {
  if (!streaming() || reduced_ || lo < 0 || hi <= lo || hi > size_ || !early_.check(lo, hi))
    return std::nullopt;
  part_segment seg;
  seg.offset = lo;
  seg.size = hi - lo;
  double total = 0;
  for (auto& s : slots_) {
    if (s.ranges.covers(lo, hi)) {
      seg.contributors.push_back(static_cast<uint32_t>(s.peer));
      total += s.weight;
      continue;
    }
    // Still owed there, or cut inside the range (the contributors change within it).
    if (!s.excluded || !s.ranges.check(lo, hi))
      return std::nullopt;
  }
  if (seg.contributors.empty() || !(total > 0) || !acc_ready_)
    return std::nullopt;
  acc_.narrow(0, lo, hi - lo).div_(total);
  early_.insert(lo, hi);
  return seg;
}

result<reduction> part_reducer::reduce_kept() {
  std::vector<const slot*> done;
  for (auto& s : slots_)
    if (!s.excluded && s.weight >= 0 && s.ranges.size() == size_)
      done.push_back(&s);
  if (done.empty())
    return fail("no complete contribution reached the reducer");
  std::vector<at::Tensor> xs;
  std::vector<double> ws;
  part_segment all;
  all.size = size_;
  for (auto* s : done) {
    xs.push_back(size_ == 0 ? torch::empty({0}, torch::kFloat32) : assemble(*s));
    ws.push_back(s->weight);
    all.contributors.push_back(static_cast<uint32_t>(s->peer));
  }
  auto r = fn_(xs, ws);
  if (!r)
    return r.error();
  acc_.copy_(r->to(torch::kFloat32).reshape({size_}));
  reduction out;
  out.values = acc_;
  out.segments.push_back(std::move(all));
  return out;
}

bool all_finite(const at::Tensor& t) {
  if (t.numel() == 0)
    return true;
  if (t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu()) {
    // One pass (min and max were two, each a reduction of its own): x - x is 0 for finite x and
    // NaN otherwise. Fixed-size blocks let the compiler vectorize the inner loop.
    const float* v = t.data_ptr<float>();
    const int64_t n = t.numel();
    constexpr int64_t block = 256;
    int64_t i = 0;
    for (; i + block <= n; i += block) {
      int bad = 0;
      for (int64_t k = 0; k < block; ++k)
        bad |= (v[i + k] - v[i + k]) != 0.0f;
      if (bad != 0)
        return false;
    }
    for (; i < n; ++i)
      if (!std::isfinite(v[i]))
        return false;
    return true;
  }
  return std::isfinite(t.max().item<double>()) && std::isfinite(t.min().item<double>());
}

// -- reports -----------------------------------------------------------------------------------

void finish_report(round_report& r) {
  r.averaged = r.kept = r.failed = 0;
  for (auto& p : r.parts) {
    if (p.size == 0)
      continue;
    switch (p.status) {
      case part_status::averaged:
        ++r.averaged;
        break;
      case part_status::own_value_kept:
        ++r.kept;
        break;
      case part_status::failed:
        ++r.failed;
        break;
    }
  }
  r.outcome = (r.kept == 0 && r.failed == 0) ? round_outcome::complete : round_outcome::partial;
}

std::string summary(const round_report& r) {
  auto s = fmt::format("{} '{}' group {:x} self {}/{}: {} averaged, {} kept, {} failed",
                       messages::to_string(r.outcome), r.group_key, r.group_id, r.self,
                       r.members.size(), r.averaged, r.kept, r.failed);
  if (!r.detail.empty())
    s += " (" + r.detail + ")";
  return s;
}

} // namespace starling::actors::averager
