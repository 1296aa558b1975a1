#include "runtime/run/masha_comparison.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace starling::runtime {

using actors::vi::codec_kind;
using actors::vi::method_kind;
using actors::vi::method_options;

namespace {

/// Bits (uplink, both directions) at the first point at or below `target`.
bool bits_to(const masha_outcome& o, double target, double& up, double& all) {
  for (const auto& p : o.trace)
    if (p.relative_error <= target) {
      up = static_cast<double>(p.bits_up);
      all = static_cast<double>(p.bits_up + p.bits_down);
      return true;
    }
  return false;
}

} // namespace

std::vector<masha_entry> masha_entries(const actors::vi::vi_problem& problem,
                                       const masha_comparison_options& options) {
  std::vector<masha_entry> out;
  const auto d = problem.dim();
  if (options.extragradient) {
    method_options o;
    o.method = method_kind::extragradient;
    o.seed = options.seed;
    out.push_back({"extragradient", recommended_options(o, problem)});
  }
  for (double f : options.k_fractions) {
    const auto k = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(f * d)));
    const auto pct = 100.0 * static_cast<double>(k) / static_cast<double>(d);
    if (options.masha1) {
      // Two downlinks (README): a dense broadcast of the average, which keeps the estimator's
      // variance at L² + (q − 1)L̃²/M and saves bits on the uplink only, and the bidirectional
      // shared-seed Rand-k, whose exact k-sparse forward costs as little as the uplink.
      method_options o;
      o.method = method_kind::masha1;
      o.worker_codec = {codec_kind::rand_k, k};
      o.server_codec = {codec_kind::dense, 0};
      o.seed = options.seed;
      out.push_back(
          {fmt::format("MASHA1 rand-k {:.3g}% dense down", pct), recommended_options(o, problem)});
      o.server_codec = {codec_kind::rand_k, k};
      o.shared_randomness = true;
      out.push_back(
          {fmt::format("MASHA1 rand-k {:.3g}% shared seed", pct), recommended_options(o, problem)});
    }
    if (options.masha2) {
      method_options o;
      o.method = method_kind::masha2;
      o.worker_codec = {codec_kind::top_k, k};
      o.server_codec = {codec_kind::top_k, k};
      o.seed = options.seed;
      out.push_back({fmt::format("MASHA2 top-k {:.3g}%", pct), recommended_options(o, problem)});
    }
  }
  return out;
}

std::string masha_table(const std::vector<masha_outcome>& outcomes, double target) {
  double eg_up = 0, eg_all = 0;
  const bool have_eg = !outcomes.empty() && outcomes.front().label == "extragradient" &&
                       bits_to(outcomes.front(), target, eg_up, eg_all);
  std::string s = fmt::format("bits per worker to relative error <= {:g}\n", target);
  s += fmt::format("  {:<32} {:>8} {:>12} {:>12} {:>9} {:>9}\n", "method", "iters", "both dirs",
                   "uplink", "EG/both", "EG/up");
  for (const auto& o : outcomes) {
    double up = 0, all = 0;
    if (!bits_to(o, target, up, all)) {
      s += fmt::format("  {:<32} {:>8} {:>12} {:>12} {:>9} {:>9}  {}\n", o.label, o.iterations,
                       "not reached", "-", "-", "-", o.note);
      continue;
    }
    if (have_eg)
      s += fmt::format("  {:<32} {:>8} {:>12.4g} {:>12.4g} {:>9.2f} {:>9.2f}\n", o.label,
                       o.iterations, all, up, eg_all / all, eg_up / up);
    else
      s += fmt::format("  {:<32} {:>8} {:>12.4g} {:>12.4g} {:>9} {:>9}\n", o.label, o.iterations,
                       all, up, "-", "-");
  }
  return s;
}

plot::line_plot masha_plot(const std::vector<masha_outcome>& outcomes, const std::string& title) {
  plot::line_plot p;
  p.title = title;
  p.x_label = "bits per worker (both directions)";
  p.y_label = "relative error |z - z*|^2 / |z0 - z*|^2";
  p.log_y = true;
  for (const auto& o : outcomes) {
    if (o.trace.empty())
      continue; // diverged before its first iteration was recorded: nothing to draw
    plot::series s;
    s.name = o.label;
    // At most ~1000 points per line: long compressed runs would make a huge file otherwise.
    const std::size_t stride = std::max<std::size_t>(1, o.trace.size() / 1000);
    for (std::size_t i = 0; i < o.trace.size(); i += stride)
      s.points.emplace_back(static_cast<double>(o.trace[i].bits_up + o.trace[i].bits_down),
                            o.trace[i].relative_error);
    if (!o.trace.empty() && (o.trace.size() - 1) % stride != 0)
      s.points.emplace_back(static_cast<double>(o.trace.back().bits_up + o.trace.back().bits_down),
                            o.trace.back().relative_error);
    p.lines.push_back(std::move(s));
  }
  return p;
}

} // namespace starling::runtime
