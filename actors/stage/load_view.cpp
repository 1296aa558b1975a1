#include "actors/stage/load_view.hpp"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace starling::actors::stage {

namespace {

double average(const stage_load& s) {
  double sum = 0;
  for (auto x : s.reported)
    sum += x;
  return s.reported.empty() ? -1 : sum / static_cast<double>(s.reported.size());
}

} // namespace

stage_total total_of(const stage_load& s) {
  stage_total out;
  out.peers = s.live;
  auto avg = average(s);
  if (s.live > 0 && s.reported.empty()) {
    out.throughput = -1;
    return out;
  }
  out.throughput = avg > 0 ? avg * static_cast<double>(s.live) : 0;
  for (auto x : s.joining) {
    auto tp = x > 0 ? x : avg;
    if (tp <= 0)
      continue; // nothing to compare with: the joiner is not counted
    out.throughput += tp;
    out.peers++;
  }
  return out;
}

std::optional<size_t> stage_for_newcomer(const std::vector<stage_load>& stages,
                                         bool all_known) {
  std::optional<size_t> best;
  double best_tp = 0;
  bool any_report = false;
  for (auto& s : stages)
    any_report = any_report || !s.reported.empty();
  if (all_known && !any_report)
    return std::nullopt;
  for (size_t k = 0; k < stages.size(); ++k) {
    auto& s = stages[k];
    if (s.live > 0 && s.reported.empty()) {
      if (all_known)
        return std::nullopt;
      continue; // unknown
    }
    auto avg = std::max(0.0, average(s));
    double tp = avg * static_cast<double>(s.live);
    for (auto x : s.joining)
      tp += x > 0 ? x : avg;
    if (!best || tp < best_tp) {
      best = k;
      best_tp = tp;
    }
  }
  return best;
}

std::optional<double> throughput_meter::close() {
  if (busy_ <= 0 || samples_ <= 0)
    return std::nullopt;
  auto measured = samples_ / busy_;
  busy_ = 0;
  samples_ = 0;
  smoothed_ = smoothed_ > 0 ? 0.7 * smoothed_ + 0.3 * measured : measured;
  return smoothed_;
}

std::string encode_load_report(double throughput, double queue) {
  return fmt::format("{:.17g} {:.17g}", throughput, queue);
}

std::optional<double> decode_load_report(const std::string& value) {
  if (value.empty() || value.size() > 64)
    return std::nullopt;
  const char* p = value.c_str();
  char* end = nullptr;
  auto tp = std::strtod(p, &end);
  if (end == p || *end != ' ')
    return std::nullopt;
  p = end + 1;
  auto queue = std::strtod(p, &end);
  if (end == p || *end != '\0')
    return std::nullopt;
  if (!std::isfinite(tp) || !(tp > 0) || !std::isfinite(queue) || queue < 0)
    return std::nullopt;
  return tp;
}

} // namespace starling::actors::stage
