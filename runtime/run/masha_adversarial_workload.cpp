#include "runtime/run/masha_adversarial_workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "messages/atoms.hpp"
#include "messages/vi.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/run/masha_adversarial.hpp"

namespace starling::runtime {

namespace {

using actors::vi::adversarial_problem;
using actors::vi::worker_loss_policy;
using messages::vi_report;

/// Method list / k list readers shared in spirit with the bilinear workload.
void read_methods(config_node& n, std::vector<std::string>& out) {
  if (!n.has("methods"))
    return;
  auto node = n.child("methods");
  if (!node.is_sequence() || node.items().empty())
    node.expected("a non-empty list of extragradient, masha1, masha2");
  out.clear();
  for (auto& item : node.items()) {
    auto m = item.as_string();
    if (m != "extragradient" && m != "masha1" && m != "masha2")
      item.expected("one of extragradient, masha1, masha2");
    if (std::find(out.begin(), out.end(), m) != out.end())
      item.fail("listed twice");
    out.push_back(m);
  }
}

void read_fractions(config_node& n, std::vector<double>& out) {
  if (!n.has("k"))
    return;
  auto node = n.child("k");
  if (!node.is_sequence() || node.items().empty())
    node.expected("a non-empty list of fractions of dim(z) in (0, 1]");
  out.clear();
  for (auto& item : node.items()) {
    const double f = item.as_double();
    if (!(f > 0 && f <= 1))
      item.expected("a fraction of dim(z) in (0, 1]");
    out.push_back(f);
  }
}

/// One method run by a server actor and M worker actors, observed in segments of iterations.
class actor_run {
public:
  actor_run(caf::actor_system& sys, const std::shared_ptr<const adversarial_problem>& problem,
            const actors::vi::method_options& options, const masha_adversarial_options& opts)
      : self_(sys), sys_(sys) {
    for (std::size_t i = 0; i < problem->workers(); ++i)
      workers_.push_back(actors::vi::spawn_worker(sys, problem, i, options));
    actors::vi::server_options so;
    so.method = options;
    so.on_worker_loss = opts.on_worker_loss;
    so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout);
    server_ = actors::vi::spawn_server(sys, problem->dim(), workers_, so);
  }
  ~actor_run() {
    self_->send_exit(server_, caf::exit_reason::user_shutdown);
    for (auto& w : workers_)
      self_->send_exit(w, caf::exit_reason::user_shutdown);
  }
  /// Runs `iterations` more iterations; the report is cumulative.
  result<vi_report> advance(uint64_t iterations) {
    result<vi_report> out = fail("vi server: no answer");
    self_->request(server_, caf::infinite, vi_run_atom::value, iterations)
      .receive([&](vi_report& r) { out = std::move(r); },
               [&](caf::error& e) { out = fail(sys_.render(e)); });
    return out;
  }

private:
  caf::scoped_actor self_;
  caf::actor_system& sys_;
  std::vector<caf::actor> workers_;
  caf::actor server_;
};

} // namespace

void read_options(config_node& n, masha_adversarial_options& out) {
  read_int(n, "workers", out.workers, 1, 1000);
  read_int(n, "train_per_worker", out.train_per_worker, 1, 60000);
  read_int(n, "test_images", out.test_images, 1, 10000);
  read_real(n, "epsilon", out.epsilon, 0, 1);
  read_real(n, "lambda", out.lambda, 0, 1e6);
  read_real(n, "beta", out.beta, 0, 1e6);
  read_choice(n, "data", out.data, {"auto", "fashion-mnist", "synthetic"});
  read(n, "data_dir", out.data_dir);
  read_non_negative(n, "seed", out.seed);
  read_methods(n, out.methods);
  read_fractions(n, out.k);
  read_int(n, "budget_eg_iterations", out.budget_eg_iterations, 1, 1000000);
  read_int(n, "checkpoints", out.checkpoints, 1, 1000);
  read_int(n, "max_iterations", out.max_iterations, 1, int64_t{1} << 40);
  read_real(n, "gamma_scale", out.gamma_scale, 1e-6, 1e6);
  read_int(n, "attack_steps", out.attack_steps, 0, 1000);
  if (n.has("on_worker_loss")) {
    std::string policy;
    read_choice(n, "on_worker_loss", policy, {"fail", "continue"});
    out.on_worker_loss =
      policy == "fail" ? worker_loss_policy::fail : worker_loss_policy::continue_run;
  }
  read_duration(n, "timeout", out.timeout);
  if (out.timeout.count() <= 0)
    n.child("timeout").expected("a positive duration");
  if (out.workers * out.train_per_worker > 60000)
    n.child("train_per_worker")
      .fail(fmt::format("workers × train_per_worker = {} × {} = {} training images, at most "
                        "60000 (Fashion-MNIST's training set)",
                        out.workers, out.train_per_worker, out.workers * out.train_per_worker));
}

int run_masha_adversarial(const experiment_config& cfg, const run_context& ctx) {
  masha_adversarial_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    read_options(section, opts);
    section.finish();
  }
  if (ctx.simulate) {
    log(log_level::error, "masha-adversarial",
        "the masha-adversarial workload runs in local mode only (experiment.mode: local, no --sim)");
    return 1;
  }
  actors::vi::adversarial_options ao;
  ao.workers = static_cast<std::size_t>(opts.workers);
  ao.train_per_worker = static_cast<std::size_t>(opts.train_per_worker);
  ao.test_images = static_cast<std::size_t>(opts.test_images);
  ao.epsilon = opts.epsilon;
  ao.lambda = opts.lambda;
  ao.beta = opts.beta;
  ao.data_dir = opts.data_dir;
  ao.synthetic = opts.data == "synthetic";
  ao.attack_steps = static_cast<std::size_t>(opts.attack_steps);
  ao.seed = opts.seed;
  if (opts.data == "fashion-mnist" && !kernels::fashion_mnist_present(opts.data_dir)) {
    log(log_level::error, "masha-adversarial",
        "data: fashion-mnist, but {} lacks the Fashion-MNIST idx files (install the Debian "
        "package dataset-fashion-mnist, scripts/install-deps does) — or use data: auto | synthetic",
        opts.data_dir);
    return 1;
  }
  auto made = adversarial_problem::make(ao);
  if (!made) {
    log(log_level::error, "masha-adversarial", "{}", made.error().what);
    return 1;
  }
  auto problem = std::make_shared<const adversarial_problem>(std::move(*made));
  actors::vi::use_one_torch_thread();
  if (problem->fell_back())
    log(log_level::warning, "masha-adversarial",
        "Fashion-MNIST not found in {}; using the generated stand-in {}", opts.data_dir,
        problem->data_source());
  masha_comparison_options co;
  auto wants = [&](const char* m) {
    return std::find(opts.methods.begin(), opts.methods.end(), m) != opts.methods.end();
  };
  co.extragradient = wants("extragradient");
  co.masha1 = wants("masha1");
  co.masha2 = wants("masha2");
  co.k_fractions = opts.k;
  co.seed = opts.seed;
  const uint64_t budget =
    adversarial_budget(*problem, static_cast<std::size_t>(opts.budget_eg_iterations));
  const auto checkpoints = static_cast<std::size_t>(opts.checkpoints);
  const auto max_iterations = static_cast<uint64_t>(opts.max_iterations);
  fmt::print("masha-adversarial: softmax regression + universal L-inf perturbation (eps = {}), "
             "dim(z) = {}, M = {} workers x {} images of {}, {} test images\n"
             "  L estimate {:.3f}, L~ {:.3f}; budget {:.4g} bits per worker (= {} extragradient "
             "iterations)\n",
             opts.epsilon, problem->dim(), problem->workers(), opts.train_per_worker,
             problem->data_source(), opts.test_images, problem->lipschitz(),
             problem->mean_square_lipschitz(), static_cast<double>(budget),
             opts.budget_eg_iterations);
  jsonl_writer out{ctx.out_dir + "/metrics.jsonl"};
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg.caf, false);
  caf::actor_system sys{sys_cfg};
  std::vector<adversarial_outcome> outcomes;
  const auto start_eval = problem->evaluate(std::vector<double>(problem->dim(), 0.0));
  for (auto e : masha_entries(*problem, co)) {
    e.options = actors::vi::recommended_options(e.options, *problem, opts.gamma_scale);
    adversarial_outcome o;
    o.label = e.label;
    o.gamma = e.options.gamma;
    o.tau = e.options.tau;
    o.points.push_back({0, 0, 0, start_eval});
    fmt::print("  {:<32} gamma {:.5f}  tau {:.4f}\n", e.label, e.options.gamma, e.options.tau);
    std::fflush(stdout);
    actor_run run{sys, problem, e.options, opts};
    uint64_t iterations = 0, bits = 0;
    std::size_t next = 1;
    auto threshold = [&](std::size_t j) {
      return static_cast<uint64_t>(static_cast<double>(budget) * static_cast<double>(j) /
                                   static_cast<double>(checkpoints));
    };
    while (next <= checkpoints) {
      // Iterations to the next checkpoint at the bits per iteration seen so far (one at first).
      uint64_t n = 1;
      if (iterations > 0) {
        const double rate = static_cast<double>(bits) / static_cast<double>(iterations);
        n = static_cast<uint64_t>(
          std::ceil(static_cast<double>(threshold(next) - std::min(bits, threshold(next))) / rate));
      }
      n = std::clamp<uint64_t>(n, 1, max_iterations - iterations);
      auto rep = run.advance(n);
      if (!rep) {
        log(log_level::error, "masha-adversarial", "{}: {}", e.label, rep.error().what);
        return 1;
      }
      iterations = rep->iterations;
      bits = rep->bits_up + rep->bits_down;
      if (!all_finite(rep->z)) {
        o.note = fmt::format("diverged by iteration {}", iterations);
        break;
      }
      const bool capped = iterations >= max_iterations;
      if (bits < threshold(next) && !capped)
        continue;
      while (next <= checkpoints && bits >= threshold(next))
        ++next;
      adversarial_point pt{iterations, rep->bits_up, rep->bits_down, problem->evaluate(rep->z)};
      o.points.push_back(pt);
      fmt::print("    {:>3.0f}% of budget: {:>6} iterations, clean {:.1f}%, adversarial {:.1f}%, "
                 "{} live workers\n",
                 100.0 * static_cast<double>(bits) / static_cast<double>(budget), iterations,
                 100 * pt.eval.clean_accuracy, 100 * pt.eval.adversarial_accuracy,
                 rep->live_workers);
      std::fflush(stdout);
      out.write({{"event", "point"},
                 {"method", e.label},
                 {"iteration", iterations},
                 {"bits_up", rep->bits_up},
                 {"bits_down", rep->bits_down},
                 {"clean_accuracy", pt.eval.clean_accuracy},
                 {"adversarial_accuracy", pt.eval.adversarial_accuracy},
                 {"clean_loss", pt.eval.clean_loss},
                 {"adversarial_loss", pt.eval.adversarial_loss},
                 {"live_workers", rep->live_workers}});
      if (capped && next <= checkpoints) {
        o.note = fmt::format("iteration cap {} hit at {:.0f}% of the budget", max_iterations,
                             100.0 * static_cast<double>(bits) / static_cast<double>(budget));
        break;
      }
    }
    if (!o.note.empty())
      fmt::print("    {}\n", o.note);
    const auto& last = o.points.back();
    out.write({{"event", "result"},
               {"method", e.label},
               {"gamma", o.gamma},
               {"tau", o.tau},
               {"iterations", last.iteration},
               {"bits_up", last.bits_up},
               {"bits_down", last.bits_down},
               {"clean_accuracy", last.eval.clean_accuracy},
               {"adversarial_accuracy", last.eval.adversarial_accuracy},
               {"note", o.note}});
    outcomes.push_back(std::move(o));
  }
  fmt::print("\n{}", adversarial_table(outcomes, budget));
  const auto title = fmt::format("adversarial training, eps = {}, dim(z) = {}, M = {}",
                                 opts.epsilon, problem->dim(), problem->workers());
  for (bool adversarial : {true, false}) {
    const auto path = ctx.out_dir + (adversarial ? "/masha-adversarial.svg"
                                                 : "/masha-adversarial-clean.svg");
    if (auto st = plot::write_svg(adversarial_plot(outcomes, adversarial, title), path); !st) {
      log(log_level::error, "masha-adversarial", "{}", st.what());
      return 1;
    }
  }
  fmt::print("  metrics: {0}/metrics.jsonl, plots: {0}/masha-adversarial.svg, "
             "{0}/masha-adversarial-clean.svg\n",
             ctx.out_dir);
  return 0;
}

} // namespace starling::runtime
