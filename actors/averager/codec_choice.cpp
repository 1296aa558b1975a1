#include "actors/averager/codec_choice.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "kernels/compress/codec.hpp"

namespace starling::actors::averager {

result<codec_profile> measure_codec(const at::Tensor& sample, kernels::codec_id codec,
                                    const kernels::codec_params& params,
                                    const std::function<double()>& now_seconds) {
  if (!sample.defined() || sample.dim() != 1 || sample.scalar_type() != torch::kFloat32
      || sample.numel() == 0)
    return fail("measure_codec: a non-empty 1-D fp32 sample was expected");
  codec_profile p;
  p.codec = codec;
  auto n = static_cast<double>(sample.numel());
  // The fastest of three timings: a process that lost its core for a moment (4 averaging
  // processes on 2 cores) read 25-50x the cost in one of them, and the choice followed it.
  result<kernels::encoded_tensor> enc = fail("unset");
  result<at::Tensor> dec = fail("unset");
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = now_seconds();
    enc = kernels::encode(sample, codec, params);
    if (!enc)
      return fail(fmt::format("measure_codec: {}", enc.error().what));
    dec = kernels::decode(*enc);
    auto t1 = now_seconds();
    if (!dec)
      return fail(fmt::format("measure_codec: {}", dec.error().what));
    best = std::min(best, std::max(0.0, t1 - t0));
  }
  p.bytes_per_element = static_cast<double>(enc->payload_bytes()) / n;
  p.seconds_per_element = best / n;
  auto norm = sample.norm().item<double>();
  auto diff = (dec->to(torch::kFloat32).reshape({-1}) - sample).norm().item<double>();
  p.relative_error = norm > 0 ? diff / norm : (diff > 0 ? 1.0 : 0.0);
  return p;
}

codec_chooser::codec_chooser(codec_choice_options opts) : opts_(std::move(opts)) {
  if (std::find(opts_.candidates.begin(), opts_.candidates.end(), kernels::codec_id::none)
      == opts_.candidates.end())
    opts_.candidates.push_back(kernels::codec_id::none);
  opts_.smoothing = std::clamp(opts_.smoothing, 1e-3, 1.0);
}

void codec_chooser::set_profile(const codec_profile& p) {
  profiles_[p.codec] = p;
}

bool codec_chooser::profiled() const {
  return std::all_of(opts_.candidates.begin(), opts_.candidates.end(),
                     [this](kernels::codec_id c) { return profiles_.count(c) > 0; });
}

void codec_chooser::observe(double bytes, double seconds) {
  if (!(bytes > 0) || !(seconds > 0) || !std::isfinite(bytes) || !std::isfinite(seconds))
    return;
  auto b = bytes / seconds;
  throughput_ = throughput_ ? (1 - opts_.smoothing) * *throughput_ + opts_.smoothing * b : b;
}

double codec_chooser::estimated_error(kernels::codec_id codec, size_t members) const {
  auto it = profiles_.find(codec);
  if (it == profiles_.end())
    return codec == kernels::codec_id::none ? 0.0 : std::numeric_limits<double>::infinity();
  auto n = static_cast<double>(std::max<size_t>(members, 1));
  return it->second.relative_error * std::sqrt(1 + 1 / n);
}

double codec_chooser::estimated_seconds(kernels::codec_id codec, int64_t elements,
                                        size_t members) const {
  auto it = profiles_.find(codec);
  if (it == profiles_.end())
    return std::numeric_limits<double>::infinity();
  auto n = static_cast<double>(std::max<size_t>(members, 2));
  auto moved = 2 * (n - 1) / n * static_cast<double>(elements);
  auto cpu = moved * it->second.seconds_per_element;
  auto net = throughput_ ? moved * it->second.bytes_per_element / *throughput_ : 0.0;
  return std::max(cpu, net);
}

namespace {

/// Elements a member sends and receives in a butterfly round.
double moved_elements(int64_t elements, size_t members) {
  auto n = static_cast<double>(std::max<size_t>(members, 2));
  return 2 * (n - 1) / n * static_cast<double>(elements);
}

} // namespace

void codec_chooser::observe_round(kernels::codec_id codec, int64_t elements, size_t members,
                                  double seconds) {
  auto moved = moved_elements(elements, members);
  if (!(seconds > 0) || !std::isfinite(seconds) || !(moved > 0))
    return;
  // The links: the round's bytes over its duration, a lower bound (the round also computes and
  // waits for its peers), so the estimate errs toward compressing.
  if (auto p = profiles_.find(codec); p != profiles_.end())
    observe(moved * p->second.bytes_per_element, seconds);
  auto per = seconds / moved;
  ++rounds_;
  auto it = observed_.find(codec);
  if (it == observed_.end())
    observed_.emplace(codec, observation{per, rounds_});
  else if (stale(it->second)) // a retry: the old observation says nothing about now
    it->second = observation{per, rounds_};
  else
    it->second = observation{(1 - opts_.smoothing) * it->second.seconds_per_element
                        + opts_.smoothing * per,
                      rounds_};
}

bool codec_chooser::stale(const observation& s) const {
  return opts_.retry_after > 0 && rounds_ >= s.round + opts_.retry_after;
}

kernels::codec_id codec_chooser::choose(int64_t elements, size_t members) const {
  if (!profiled() || local_)
    return kernels::codec_id::none;
  auto best = kernels::codec_id::none;
  auto best_time = std::numeric_limits<double>::infinity();
  auto best_bytes = std::numeric_limits<double>::infinity();
  auto moved = moved_elements(elements, members);
  // Observed codecs by their rounds; unobserved ones by the model, uncompressed tried once.
  for (auto c : opts_.candidates) {
    if (estimated_error(c, members) > opts_.error_budget)
      continue;
    auto& p = profiles_.at(c);
    if (!throughput_) { // nothing measured yet: the fewest bytes
      if (p.bytes_per_element < best_bytes) {
        best_bytes = p.bytes_per_element;
        best = c;
      }
      continue;
    }
    auto seen = observed_.find(c);
    if (seen == observed_.end() && c == kernels::codec_id::none && !observed_.empty())
      return c;
    auto t = seen != observed_.end() ? seen->second.seconds_per_element * moved
                                     : estimated_seconds(c, elements, members);
    if (t < best_time) {
      best_time = t;
      best = c;
    }
  }
  if (!throughput_)
    return best;
  // A codec that lost is tried again once its observation is stale, if it came close; the
  // oldest observation first.
  auto retry = best;
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  for (auto& [c, s] : observed_) {
    if (c == best || estimated_error(c, members) > opts_.error_budget
        || std::find(opts_.candidates.begin(), opts_.candidates.end(), c)
               == opts_.candidates.end())
      continue;
    if (stale(s) && s.seconds_per_element * moved <= opts_.retry_ratio * best_time
        && s.round < oldest) {
      oldest = s.round;
      retry = c;
    }
  }
  return retry;
}

std::string codec_chooser::describe(int64_t elements, size_t members) const {
  std::string out;
  auto moved = moved_elements(elements, members);
  for (auto c : opts_.candidates) {
    auto it = profiles_.find(c);
    if (it == profiles_.end())
      continue;
    auto& p = it->second;
    out += fmt::format("{}{} cpu {:.3f} s net {} err {:.1e}", out.empty() ? "" : ", ",
                       kernels::to_string(c), moved * p.seconds_per_element,
                       throughput_ ? fmt::format("{:.3f} s", moved * p.bytes_per_element
                                                                / *throughput_)
                                   : std::string{"?"},
                       estimated_error(c, members));
    if (auto seen = observed_.find(c); seen != observed_.end())
      out += fmt::format(" seen {:.3f} s", seen->second.seconds_per_element * moved);
  }
  if (local_)
    out += "; links same-host (shared memory): uncompressed";
  else if (throughput_)
    out += fmt::format("; links {:.1f} MB/s", *throughput_ / 1e6);
  return out;
}

} // namespace starling::actors::averager
