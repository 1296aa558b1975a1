#include "runtime/run/masha_workload.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "messages/atoms.hpp"
#include "messages/vi.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/run/masha_comparison.hpp"

namespace starling::runtime {

namespace {

using actors::vi::bilinear_problem;
using actors::vi::method_options;
using actors::vi::worker_loss_policy;
using messages::vi_report;

/// Runs `options` with one server and M worker actors for `iterations` iterations.
result<vi_report> run_actors(caf::actor_system& sys,
                             const std::shared_ptr<const bilinear_problem>& problem,
                             const method_options& options, const masha_workload_options& opts,
                             uint64_t iterations) {
  std::vector<caf::actor> workers;
  for (std::size_t i = 0; i < problem->workers(); ++i)
    workers.push_back(actors::vi::spawn_worker(sys, problem, i, options));
  actors::vi::server_options so;
  so.method = options;
  so.on_worker_loss = opts.on_worker_loss;
  so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout);
  auto server = actors::vi::spawn_server(sys, problem->dim(), workers, so);
  result<vi_report> out = fail("vi server: no answer");
  caf::scoped_actor self{sys};
  self->request(server, caf::infinite, vi_run_atom::value, iterations)
      .receive([&](vi_report& r) { out = std::move(r); },
               [&](caf::error& e) { out = fail(sys.render(e)); });
  self->send_exit(server, caf::exit_reason::user_shutdown);
  for (auto& w : workers)
    self->send_exit(w, caf::exit_reason::user_shutdown);
  return out;
}

} // namespace

void read_options(config_node& n, masha_workload_options& out) {
  read_int(n, "d", out.dim, 1, 100000);
  read_int(n, "workers", out.workers, 1, 100000);
  read_real(n, "lambda", out.lambda, 1e-12, 1e12);
  read_real(n, "heterogeneity", out.heterogeneity, 0, 1e6);
  read_non_negative(n, "seed", out.seed);
  if (n.has("methods")) {
    auto node = n.child("methods");
    if (!node.is_sequence() || node.items().empty())
      node.expected("a non-empty list of extragradient, masha1, masha2");
    out.methods.clear();
    for (auto& item : node.items()) {
      auto m = item.as_string();
      if (m != "extragradient" && m != "masha1" && m != "masha2")
        item.expected("one of extragradient, masha1, masha2");
      if (std::find(out.methods.begin(), out.methods.end(), m) != out.methods.end())
        item.fail("listed twice");
      out.methods.push_back(m);
    }
  }
  if (n.has("k")) {
    auto node = n.child("k");
    if (!node.is_sequence() || node.items().empty())
      node.expected("a non-empty list of fractions of d in (0, 1]");
    out.k.clear();
    for (auto& item : node.items()) {
      const double f = item.as_double();
      if (!(f > 0 && f <= 1))
        item.expected("a fraction of d in (0, 1]");
      out.k.push_back(f);
    }
  }
  read_real(n, "target", out.target, 1e-300, 1);
  if (!(out.target < 1))
    n.child("target").expected("a relative error below 1");
  read_int(n, "max_iterations", out.max_iterations, 1, int64_t{1} << 40);
  if (n.has("on_worker_loss")) {
    std::string policy;
    read_choice(n, "on_worker_loss", policy, {"fail", "continue"});
    out.on_worker_loss =
        policy == "fail" ? worker_loss_policy::fail : worker_loss_policy::continue_run;
  }
  read_duration(n, "timeout", out.timeout);
  if (out.timeout.count() <= 0)
    n.child("timeout").expected("a positive duration");
}

int run_masha(const experiment_config& cfg, const run_context& ctx) {
  masha_workload_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    read_options(section, opts);
    section.finish();
  }
  if (ctx.simulate) {
    log(log_level::error, "masha",
        "the masha workload runs in local mode only (experiment.mode: local, no --sim)");
    return 1;
  }
  actors::vi::bilinear_options bo;
  bo.dim_per_player = static_cast<std::size_t>(opts.dim);
  bo.workers = static_cast<std::size_t>(opts.workers);
  bo.lambda = opts.lambda;
  bo.heterogeneity = opts.heterogeneity;
  bo.seed = opts.seed;
  auto made = bilinear_problem::make(bo);
  if (!made) {
    log(log_level::error, "masha", "{}", made.error().what);
    return 1;
  }
  auto problem = std::make_shared<const bilinear_problem>(std::move(*made));
  masha_comparison_options co;
  auto wants = [&](const char* m) {
    return std::find(opts.methods.begin(), opts.methods.end(), m) != opts.methods.end();
  };
  co.extragradient = wants("extragradient");
  co.masha1 = wants("masha1");
  co.masha2 = wants("masha2");
  co.k_fractions = opts.k;
  co.seed = opts.seed;
  fmt::print("masha: bilinear problem d = {} (z), M = {}, L = {:.3f}, L~ = {:.3f}, mu = {:.3f}\n",
             problem->dim(), problem->workers(), problem->lipschitz(),
             problem->mean_square_lipschitz(), problem->mu());
  jsonl_writer out{ctx.out_dir + "/metrics.jsonl"};
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg.caf, false);
  caf::actor_system sys{sys_cfg};
  std::vector<masha_outcome> outcomes;
  for (const auto& e : masha_entries(*problem, co)) {
    // The pure cores give the per-iteration trace (the actors report only their final state);
    // the actor run must then land on the same point with the same bit counts.
    auto pure = actors::vi::run_pure(problem, e.options,
                                     {static_cast<std::size_t>(opts.max_iterations), opts.target});
    if (!pure) {
      // A diverging method is a result of the comparison, not an error of the run.
      fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}: {}\n", e.label, e.options.gamma, e.options.tau,
                 pure.error().what);
      out.write({{"event", "result"},
                 {"method", e.label},
                 {"gamma", e.options.gamma},
                 {"tau", e.options.tau},
                 {"reached", false},
                 {"note", pure.error().what}});
      outcomes.push_back({e.label, {}, false, 0, pure.error().what});
      continue;
    }
    fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}: {} iterations with {} worker actors ...\n",
               e.label, e.options.gamma, e.options.tau, pure->iterations, problem->workers());
    auto rep = run_actors(sys, problem, e.options, opts, pure->iterations);
    if (!rep) {
      log(log_level::error, "masha", "{}: {}", e.label, rep.error().what);
      return 1;
    }
    const auto& last = pure->trace.back();
    const double err = problem->relative_error(rep->z);
    fmt::print("  {:<32} actors: relative error {:.3e} (pure replay {:.3e}), {} live workers, "
               "{} bits up, {} bits down per worker\n",
               "", err, last.relative_error, rep->live_workers, rep->bits_up, rep->bits_down);
    const bool all_live = rep->live_workers == problem->workers();
    if (all_live && (rep->bits_up != last.bits_up || rep->bits_down != last.bits_down)) {
      log(log_level::error, "masha",
          "{}: the actors sent {} / {} bits per worker, the pure replay {} / {}", e.label,
          rep->bits_up, rep->bits_down, last.bits_up, last.bits_down);
      return 1;
    }
    const std::size_t stride = std::max<std::size_t>(1, pure->trace.size() / 2000);
    for (std::size_t i = 0; i < pure->trace.size(); i += stride) {
      const auto& p = pure->trace[i];
      out.write({{"event", "point"},
                 {"method", e.label},
                 {"iteration", p.iteration},
                 {"relative_error", p.relative_error},
                 {"bits_up", p.bits_up},
                 {"bits_down", p.bits_down}});
    }
    out.write({{"event", "result"},
               {"method", e.label},
               {"gamma", e.options.gamma},
               {"tau", e.options.tau},
               {"iterations", rep->iterations},
               {"reached", pure->reached},
               {"relative_error", err},
               {"bits_up", rep->bits_up},
               {"bits_down", rep->bits_down},
               {"live_workers", rep->live_workers}});
    outcomes.push_back({e.label, std::move(pure->trace), pure->reached, pure->iterations, {}});
  }
  const auto table = masha_table(outcomes, opts.target);
  fmt::print("\n{}", table);
  const auto svg = ctx.out_dir + "/masha-bilinear.svg";
  auto plot = masha_plot(outcomes, fmt::format("bilinear saddle point, d = {}, M = {}",
                                               problem->dim(), problem->workers()));
  if (auto st = plot::write_svg(plot, svg); !st) {
    log(log_level::error, "masha", "{}", st.what());
    return 1;
  }
  fmt::print("  metrics: {}/metrics.jsonl, plot: {}\n", ctx.out_dir, svg);
  return 0;
}

} // namespace starling::runtime
