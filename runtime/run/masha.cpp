// The `masha` and `masha-adversarial` kinds: extragradient, MASHA1 and MASHA2 as a graph of
// `vi.worker` instances and one `vi.server` (actors/vi/driver.hpp: resolves the workers, runs
// the method's server over them and reports each segment of iterations as a metric), compared
// in a study that runs the graph once per method. `masha` checks the actors against the pure cores'
// replay (same bits, same point) on a bilinear saddle point; `masha-adversarial` gives every
// method the same budget of bits on adversarial Fashion-MNIST training and measures accuracy.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "actors/vi/driver.hpp"
#include "actors/vi/vi.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/vi.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/plot/svg.hpp"
#include "runtime/run/kinds.hpp"
#include "runtime/run/masha_adversarial.hpp"
#include "runtime/run/masha_comparison.hpp"

namespace starling::runtime {

namespace {

using actors::vi::segment_policy;
using actors::vi::worker_loss_policy;
using messages::vi_report;

/// Options of both vi role types: the problem, the method, and the server's schedule.
struct vi_role_options {
  std::shared_ptr<const actors::vi::vi_problem> problem;
  actors::vi::method_options method;
  actors::vi::server_options server;
  /// Makes the schedule of one run (fresh per spawn: it keeps the run's counters).
  std::function<segment_policy()> schedule;
};

/// Collects the segments of one method's run.
struct vi_outcome {
  std::vector<metric_record> segments;
  std::string failure;
  bool done = false;
};

class vi_reporter : public reporter {
public:
  explicit vi_reporter(std::shared_ptr<vi_outcome> out) : out_(std::move(out)) {}
  void on_metric(const metric_record& m) override {
    if (m.kind == "segment")
      out_->segments.push_back(m);
    else if (m.kind == "failed")
      out_->failure = m.label("reason");
    else if (m.kind == "done")
      out_->done = true;
  }
  bool tick(double) override { return out_->done || !out_->failure.empty(); }

private:
  std::shared_ptr<vi_outcome> out_;
};

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

void read_server(config_node& n, actors::vi::server_options& s) {
  if (n.has("on_worker_loss")) {
    std::string policy;
    read_choice(n, "on_worker_loss", policy, {"fail", "continue"});
    s.on_worker_loss = policy == "fail" ? worker_loss_policy::fail : worker_loss_policy::continue_run;
  }
  std::chrono::nanoseconds timeout = s.timeout;
  read_duration(n, "timeout", timeout);
  if (timeout.count() <= 0)
    n.child("timeout").expected("a positive duration");
  s.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
}

masha_comparison_options comparison(const std::vector<std::string>& methods,
                                    const std::vector<double>& k, uint64_t seed) {
  masha_comparison_options co;
  auto wants = [&](const char* m) {
    return std::find(methods.begin(), methods.end(), m) != methods.end();
  };
  co.extragradient = wants("extragradient");
  co.masha1 = wants("masha1");
  co.masha2 = wants("masha2");
  co.k_fractions = k;
  co.seed = seed;
  return co;
}

/// The graph of one method: `workers` vi.worker instances and the vi.server, all spread.
experiment_graph method_graph(const experiment_graph& base, const vi_role_options& o,
                              size_t workers, std::shared_ptr<vi_outcome> out) {
  auto g = base;
  g.study = nullptr;
  g.roles.clear();
  role_spec w;
  w.name = "worker";
  w.type = "vi.worker";
  w.replicas = workers;
  w.options = o;
  role_spec s;
  s.name = "server";
  s.type = "vi.server";
  s.options = o;
  s.restart.supervised = false;
  g.roles = {w, s};
  g.reporters = {[out] { return std::make_unique<vi_reporter>(out); }};
  return g;
}

/// `masha:` — the bilinear comparison: the pure replay gives each method's iterations and
/// trace; the actors must land on the same point with the same bits.
void expand_masha(config_node& n, experiment_graph& g, const expand_context&) {
  int64_t dim = 100, workers = 10, max_iterations = 200000;
  double lambda = 0.1, heterogeneity = 0.5, target = 1e-6;
  uint64_t seed = 1;
  std::vector<std::string> methods{"extragradient", "masha1", "masha2"};
  std::vector<double> k{0.01, 0.10};
  actors::vi::server_options server;
  read_int(n, "d", dim, 1, 100000);
  read_int(n, "workers", workers, 1, 100000);
  read_real(n, "lambda", lambda, 1e-12, 1e12);
  read_real(n, "heterogeneity", heterogeneity, 0, 1e6);
  read_non_negative(n, "seed", seed);
  read_methods(n, methods);
  read_fractions(n, k);
  read_real(n, "target", target, 1e-300, 1);
  if (!(target < 1))
    n.child("target").expected("a relative error below 1");
  read_int(n, "max_iterations", max_iterations, 1, int64_t{1} << 40);
  read_server(n, server);
  actors::vi::bilinear_options bo;
  bo.dim_per_player = static_cast<std::size_t>(dim);
  bo.workers = static_cast<std::size_t>(workers);
  bo.lambda = lambda;
  bo.heterogeneity = heterogeneity;
  bo.seed = seed;
  auto made = actors::vi::bilinear_problem::make(bo);
  if (!made)
    n.fail(made.error().what);
  auto problem = std::make_shared<const actors::vi::bilinear_problem>(std::move(*made));
  vi_role_options proto;
  proto.problem = problem;
  proto.server = server;
  proto.schedule = [] { return segment_policy{}; };
  g.roles.clear();
  g.nodes = g.nodes == 0 ? 1 : g.nodes;
  auto base = method_graph(g, proto, problem->workers(), std::make_shared<vi_outcome>());
  g.roles = base.roles;
  g.study = [problem, co = comparison(methods, k, seed), target, max_iterations,
             proto](const experiment_graph& self, const run_function& run,
                    const std::string& out_dir) {
    fmt::print("masha: bilinear problem d = {} (z), M = {}, L = {:.3f}, L~ = {:.3f}, mu = {:.3f}\n",
               problem->dim(), problem->workers(), problem->lipschitz(),
               problem->mean_square_lipschitz(), problem->mu());
    std::vector<masha_outcome> outcomes;
    for (const auto& e : masha_entries(*problem, co)) {
      auto pure = actors::vi::run_pure(problem, e.options,
                                       {static_cast<std::size_t>(max_iterations), target});
      if (!pure) {
        // A diverging method is a result of the comparison, not an error of the run.
        fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}: {}\n", e.label, e.options.gamma,
                   e.options.tau, pure.error().what);
        outcomes.push_back({e.label, {}, false, 0, pure.error().what});
        continue;
      }
      fmt::print("  {:<32} gamma {:.4f}  tau {:.3f}: {} iterations with {} worker actors ...\n",
                 e.label, e.options.gamma, e.options.tau, pure->iterations, problem->workers());
      std::fflush(stdout);
      auto o = proto;
      o.method = e.options;
      o.server.method = e.options;
      auto iterations = pure->iterations;
      auto p = problem;
      o.schedule = [iterations, p] {
        return [iterations, p](const vi_report* r, messages::metric_event& m) -> uint64_t {
          if (!r)
            return iterations;
          m.values["relative_error"] = p->relative_error(r->z);
          return 0;
        };
      };
      auto out = std::make_shared<vi_outcome>();
      auto rr = run(method_graph(self, o, problem->workers(), out));
      if (!out->failure.empty() || out->segments.empty()) {
        fmt::print(stderr, "starling: error: {}: {}\n", e.label,
                   out->failure.empty() ? "the run ended without a report" : out->failure);
        return 1;
      }
      auto& seg = out->segments.back();
      const auto& last = pure->trace.back();
      fmt::print("  {:<32} actors: relative error {:.3e} (pure replay {:.3e}), {:.0f} live "
                 "workers, {:.0f} bits up, {:.0f} bits down per worker ({:.1f} s)\n",
                 "", seg.value("relative_error"), last.relative_error, seg.value("live_workers"),
                 seg.value("bits_up"), seg.value("bits_down"), rr.wall_s);
      if (seg.value("live_workers") == static_cast<double>(problem->workers())
          && (seg.value("bits_up") != static_cast<double>(last.bits_up)
              || seg.value("bits_down") != static_cast<double>(last.bits_down))) {
        fmt::print(stderr, "starling: error: {}: the actors sent {:.0f} / {:.0f} bits per worker, "
                           "the pure replay {} / {}\n",
                   e.label, seg.value("bits_up"), seg.value("bits_down"), last.bits_up,
                   last.bits_down);
        return 1;
      }
      outcomes.push_back({e.label, std::move(pure->trace), pure->reached, pure->iterations, {}});
    }
    fmt::print("\n{}", masha_table(outcomes, target));
    auto svg = out_dir + "/masha-bilinear.svg";
    auto plot = masha_plot(outcomes, fmt::format("bilinear saddle point, d = {}, M = {}",
                                                 problem->dim(), problem->workers()));
    if (auto st = plot::write_svg(plot, svg); !st) {
      fmt::print(stderr, "starling: error: {}\n", st.what());
      return 1;
    }
    fmt::print("  plot: {}\n", svg);
    return 0;
  };
}

/// `masha-adversarial:` — every method gets the same budget of bits per worker; accuracies are
/// measured (by the server role) at evenly spaced fractions of it.
void expand_adversarial(config_node& n, experiment_graph& g, const expand_context&) {
  int64_t workers = 10, train_per_worker = 100, test_images = 1000, budget_eg = 100,
          checkpoints = 10, max_iterations = 5000, attack_steps = 10;
  double epsilon = 0.1, lambda = 1e-3, beta = 0, gamma_scale = 1.0;
  std::string data = "auto", data_dir = "/usr/share/datasets/fashion-mnist";
  uint64_t seed = 1;
  std::vector<std::string> methods{"extragradient", "masha1", "masha2"};
  std::vector<double> k{0.01, 0.10};
  actors::vi::server_options server;
  read_int(n, "workers", workers, 1, 1000);
  read_int(n, "train_per_worker", train_per_worker, 1, 60000);
  read_int(n, "test_images", test_images, 1, 10000);
  read_real(n, "epsilon", epsilon, 0, 1);
  read_real(n, "lambda", lambda, 0, 1e6);
  read_real(n, "beta", beta, 0, 1e6);
  read_choice(n, "data", data, {"auto", "fashion-mnist", "synthetic"});
  read(n, "data_dir", data_dir);
  read_non_negative(n, "seed", seed);
  read_methods(n, methods);
  read_fractions(n, k);
  read_int(n, "budget_eg_iterations", budget_eg, 1, 1000000);
  read_int(n, "checkpoints", checkpoints, 1, 1000);
  read_int(n, "max_iterations", max_iterations, 1, int64_t{1} << 40);
  read_real(n, "gamma_scale", gamma_scale, 1e-6, 1e6);
  read_int(n, "attack_steps", attack_steps, 0, 1000);
  read_server(n, server);
  if (workers * train_per_worker > 60000)
    n.child("train_per_worker")
      .fail(fmt::format("workers × train_per_worker = {} × {} = {} training images, at most "
                        "60000 (Fashion-MNIST's training set)",
                        workers, train_per_worker, workers * train_per_worker));
  if (data == "fashion-mnist" && !kernels::fashion_mnist_present(data_dir))
    n.child("data").fail(fmt::format(
      "fashion-mnist, but {} lacks the Fashion-MNIST idx files (install the Debian package "
      "dataset-fashion-mnist, scripts/install-deps does) — or use data: auto | synthetic",
      data_dir));
  actors::vi::adversarial_options ao;
  ao.workers = static_cast<std::size_t>(workers);
  ao.train_per_worker = static_cast<std::size_t>(train_per_worker);
  ao.test_images = static_cast<std::size_t>(test_images);
  ao.epsilon = epsilon;
  ao.lambda = lambda;
  ao.beta = beta;
  ao.data_dir = data_dir;
  ao.synthetic = data == "synthetic";
  ao.attack_steps = static_cast<std::size_t>(attack_steps);
  ao.seed = seed;
  auto made = actors::vi::adversarial_problem::make(ao);
  if (!made)
    n.fail(made.error().what);
  auto problem = std::make_shared<const actors::vi::adversarial_problem>(std::move(*made));
  vi_role_options proto;
  proto.problem = problem;
  proto.server = server;
  proto.schedule = [] { return segment_policy{}; };
  g.nodes = g.nodes == 0 ? 1 : g.nodes;
  g.roles = method_graph(g, proto, problem->workers(), std::make_shared<vi_outcome>()).roles;
  auto budget = adversarial_budget(*problem, static_cast<std::size_t>(budget_eg));
  g.study = [=, co = comparison(methods, k, seed)](const experiment_graph& self,
                                                   const run_function& run,
                                                   const std::string& out_dir) {
    actors::vi::use_one_torch_thread();
    fmt::print("masha-adversarial: softmax regression + universal L-inf perturbation (eps = {}), "
               "dim(z) = {}, M = {} workers x {} images of {}, {} test images; budget {:.4g} "
               "bits per worker (= {} extragradient iterations)\n",
               epsilon, problem->dim(), problem->workers(), train_per_worker,
               problem->data_source(), test_images, static_cast<double>(budget), budget_eg);
    std::vector<adversarial_outcome> outcomes;
    auto start_eval = problem->evaluate(std::vector<double>(problem->dim(), 0.0));
    for (auto e : masha_entries(*problem, co)) {
      e.options = actors::vi::recommended_options(e.options, *problem, gamma_scale);
      fmt::print("  {:<32} gamma {:.5f}  tau {:.4f}\n", e.label, e.options.gamma, e.options.tau);
      std::fflush(stdout);
      auto o = proto;
      o.method = e.options;
      o.server.method = e.options;
      auto p = problem;
      auto cps = static_cast<uint64_t>(checkpoints);
      auto cap = static_cast<uint64_t>(max_iterations);
      // Segments end near each checkpoint of the budget, at the bits per iteration seen so far.
      o.schedule = [=] {
        auto next = std::make_shared<uint64_t>(1);
        return [=](const vi_report* r, messages::metric_event& m) -> uint64_t {
          auto threshold = [&](uint64_t j) {
            return static_cast<uint64_t>(static_cast<double>(budget) * static_cast<double>(j)
                                         / static_cast<double>(cps));
          };
          if (!r)
            return 1;
          auto bits = r->bits_up + r->bits_down;
          if (!all_finite(r->z)) {
            m.labels["note"] = fmt::format("diverged by iteration {}", r->iterations);
            return 0;
          }
          bool checkpoint = bits >= threshold(*next) || r->iterations >= cap;
          if (checkpoint) {
            while (*next <= cps && bits >= threshold(*next))
              ++*next;
            auto ev = p->evaluate(r->z);
            m.values["clean_accuracy"] = ev.clean_accuracy;
            m.values["adversarial_accuracy"] = ev.adversarial_accuracy;
            m.values["clean_loss"] = ev.clean_loss;
            m.values["adversarial_loss"] = ev.adversarial_loss;
          }
          if (*next > cps)
            return 0;
          if (r->iterations >= cap) {
            m.labels["note"] = fmt::format("iteration cap {} hit", cap);
            return 0;
          }
          auto rate = static_cast<double>(bits) / static_cast<double>(std::max<uint64_t>(1, r->iterations));
          auto left = static_cast<double>(threshold(*next) - std::min(bits, threshold(*next)));
          return std::clamp<uint64_t>(static_cast<uint64_t>(std::ceil(left / rate)), 1,
                                      cap - r->iterations);
        };
      };
      auto out = std::make_shared<vi_outcome>();
      run(method_graph(self, o, problem->workers(), out));
      if (!out->failure.empty()) {
        fmt::print(stderr, "starling: error: {}: {}\n", e.label, out->failure);
        return 1;
      }
      adversarial_outcome oc;
      oc.label = e.label;
      oc.gamma = e.options.gamma;
      oc.tau = e.options.tau;
      oc.points.push_back({0, 0, 0, start_eval});
      for (auto& s : out->segments) {
        if (!s.label("note").empty())
          oc.note = s.label("note");
        if (s.values.count("clean_accuracy") == 0)
          continue;
        adversarial_point pt;
        pt.iteration = static_cast<std::size_t>(s.value("iterations"));
        pt.bits_up = static_cast<uint64_t>(s.value("bits_up"));
        pt.bits_down = static_cast<uint64_t>(s.value("bits_down"));
        pt.eval.clean_accuracy = s.value("clean_accuracy");
        pt.eval.adversarial_accuracy = s.value("adversarial_accuracy");
        pt.eval.clean_loss = s.value("clean_loss");
        pt.eval.adversarial_loss = s.value("adversarial_loss");
        fmt::print("    {:>3.0f}% of budget: {:>6} iterations, clean {:.1f}%, adversarial "
                   "{:.1f}%, {:.0f} live workers\n",
                   100.0 * static_cast<double>(pt.bits_up + pt.bits_down)
                     / static_cast<double>(budget),
                   pt.iteration, 100 * pt.eval.clean_accuracy, 100 * pt.eval.adversarial_accuracy,
                   s.value("live_workers"));
        oc.points.push_back(pt);
      }
      if (!oc.note.empty())
        fmt::print("    {}\n", oc.note);
      std::fflush(stdout);
      outcomes.push_back(std::move(oc));
    }
    fmt::print("\n{}", adversarial_table(outcomes, budget));
    auto title = fmt::format("adversarial training, eps = {}, dim(z) = {}, M = {}", epsilon,
                             problem->dim(), problem->workers());
    for (bool adversarial : {true, false}) {
      auto path = out_dir + (adversarial ? "/masha-adversarial.svg" : "/masha-adversarial-clean.svg");
      if (auto st = plot::write_svg(adversarial_plot(outcomes, adversarial, title), path); !st) {
        fmt::print(stderr, "starling: error: {}\n", st.what());
        return 1;
      }
    }
    fmt::print("  plots: {0}/masha-adversarial.svg, {0}/masha-adversarial-clean.svg\n", out_dir);
    return 0;
  };
}

} // namespace

void add_masha(role_registry& reg) {
  reg.add<vi_role_options>("vi.worker", "a worker of extragradient / MASHA1 / MASHA2",
                           [](role_context& ctx, const vi_role_options& o) {
                             return actors::vi::spawn_worker(ctx.node.system(), o.problem,
                                                             ctx.index, o.method);
                           });
  reg.add<vi_role_options>("vi.server",
                           "the server of extragradient / MASHA1 / MASHA2 over the `worker` role",
                           [](role_context& ctx, const vi_role_options& o) {
                             actors::vi::driver_options d;
                             d.name = ctx.name;
                             d.workers = ctx.addresses_of("worker");
                             d.resolver = ctx.node.resolver();
                             d.sink = ctx.node.metrics();
                             d.dim = o.problem->dim();
                             d.server = o.server;
                             d.next = o.schedule();
                             return actors::vi::spawn_driver(ctx.node.system(), std::move(d));
                           });
  reg.add_kind({"masha", "extragradient, MASHA1 and MASHA2 on a bilinear saddle point, as actors",
                expand_masha});
  reg.add_kind({"masha-adversarial",
                "extragradient, MASHA1 and MASHA2 on adversarial training (Fashion-MNIST), as "
                "actors",
                expand_adversarial});
}

} // namespace starling::runtime
