#include "runtime/run/masha_adversarial.hpp"

#include <cmath>

#include <fmt/format.h>

namespace starling::runtime {

uint64_t adversarial_budget(const actors::vi::vi_problem& problem, std::size_t eg_iterations) {
  return static_cast<uint64_t>(eg_iterations) * 4u * 32u * problem.dim();
}

bool all_finite(const std::vector<double>& z) {
  for (double v : z)
    if (!std::isfinite(v))
      return false;
  return true;
}

result<adversarial_outcome>
run_adversarial_pure(const std::shared_ptr<const actors::vi::adversarial_problem>& problem,
                     const masha_entry& entry, uint64_t budget, std::size_t checkpoints,
                     std::size_t max_iterations) {
  adversarial_outcome out;
  out.label = entry.label;
  out.gamma = entry.options.gamma;
  out.tau = entry.options.tau;
  out.points.push_back({0, 0, 0, problem->evaluate(std::vector<double>(problem->dim(), 0.0))});
  std::size_t next = 1;
  const auto threshold = [&](std::size_t j) {
    return static_cast<uint64_t>(static_cast<double>(budget) * static_cast<double>(j) /
                                 static_cast<double>(checkpoints));
  };
  auto st = actors::vi::run_cores(
    problem, entry.options, max_iterations, [&](const actors::vi::worker_core& w0) {
      const uint64_t bits = w0.bits_up() + w0.bits_down();
      const bool last = w0.iterations() >= max_iterations;
      if (bits < threshold(next) && !last)
        return true;
      while (next <= checkpoints && bits >= threshold(next))
        ++next;
      if (!all_finite(w0.z())) {
        out.note = fmt::format("diverged by iteration {}", w0.iterations());
        return false;
      }
      out.points.push_back({w0.iterations(), w0.bits_up(), w0.bits_down(),
                            problem->evaluate(w0.z())});
      if (next > checkpoints)
        return false;
      if (last)
        out.note = fmt::format("iteration cap {} hit at {:.0f}% of the budget", max_iterations,
                               100.0 * static_cast<double>(bits) / static_cast<double>(budget));
      return !last;
    });
  if (!st)
    return fail(st.what());
  return out;
}

std::string adversarial_table(const std::vector<adversarial_outcome>& outcomes, uint64_t budget) {
  const double fractions[] = {0.25, 0.5, 1.0};
  std::string s = fmt::format(
    "clean / adversarial accuracy (%) on held-out images after a share of the budget of {:.4g} "
    "bits per worker (both directions)\n",
    static_cast<double>(budget));
  s += fmt::format("  {:<32} {:>8} {:>6} {:>8} {:>13} {:>13} {:>13}\n", "method", "gamma", "tau",
                   "iters", "1/4 budget", "1/2 budget", "full budget");
  for (const auto& o : outcomes) {
    std::string cells;
    for (double f : fractions) {
      // The last evaluation within this share of the budget (a little slack for the last step).
      const adversarial_point* best = nullptr;
      for (const auto& p : o.points)
        if (static_cast<double>(p.bits_up + p.bits_down) <= f * static_cast<double>(budget) * 1.02)
          best = &p;
      cells += best ? fmt::format(" {:>13}", fmt::format("{:.1f} / {:.1f}",
                                                         100 * best->eval.clean_accuracy,
                                                         100 * best->eval.adversarial_accuracy))
                    : fmt::format(" {:>13}", "-");
    }
    const std::size_t iters = o.points.empty() ? 0 : o.points.back().iteration;
    s += fmt::format("  {:<32} {:>8.4f} {:>6.3f} {:>8}{}{}\n", o.label, o.gamma, o.tau, iters,
                     cells, o.note.empty() ? "" : "  " + o.note);
  }
  return s;
}

plot::line_plot adversarial_plot(const std::vector<adversarial_outcome>& outcomes,
                                 bool adversarial, const std::string& title) {
  plot::line_plot p;
  p.title = title;
  p.x_label = "bits per worker (both directions)";
  p.y_label = adversarial ? "adversarial accuracy (held-out)" : "clean accuracy (held-out)";
  for (const auto& o : outcomes) {
    plot::series s;
    s.name = o.label;
    for (const auto& pt : o.points)
      s.points.emplace_back(static_cast<double>(pt.bits_up + pt.bits_down),
                            adversarial ? pt.eval.adversarial_accuracy : pt.eval.clean_accuracy);
    if (!s.points.empty())
      p.lines.push_back(std::move(s));
  }
  return p;
}

} // namespace starling::runtime
