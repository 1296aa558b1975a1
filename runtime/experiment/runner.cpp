#include "runtime/experiment/runner.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "runtime/experiment/node_runtime.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/watch.hpp"

namespace starling::runtime {

namespace {

/// The report of a plain graph: how many metrics of each kind came from each role.
class counting_reporter : public reporter {
public:
  void start(const run_info& info) override { graph_ = info.graph; }

  void on_metric(const metric_record& m) override {
    auto dot = m.source.find('.');
    auto role = dot == std::string::npos ? m.source : m.source.substr(0, dot);
    if (m.source.find('/') != std::string::npos)
      role = "(node services)";
    counts_[role][m.kind]++;
  }

  int finish(finish_context& ctx) override {
    fmt::print("\nrun summary{} ({:.1f} s of run time, {:.1f} s wall)\n",
               ctx.timed_out ? "" : " (work complete)", ctx.run_s, ctx.wall_s);
    fmt::print("  {:<20} {:<20} {:>10}\n", "role", "metric", "events");
    for (auto& [role, kinds] : counts_)
      for (auto& [kind, n] : kinds)
        fmt::print("  {:<20} {:<20} {:>10}\n", role, kind, n);
    return 0;
  }

private:
  const experiment_graph* graph_ = nullptr;
  std::map<std::string, std::map<std::string, uint64_t>> counts_;
};

} // namespace

std::unique_ptr<reporter> make_counting_reporter() {
  return std::make_unique<counting_reporter>();
}

std::vector<std::unique_ptr<reporter>> make_reporters(const experiment_graph& g) {
  std::vector<std::unique_ptr<reporter>> out;
  for (auto& f : g.reporters)
    if (auto r = f())
      out.push_back(std::move(r));
  if (out.empty())
    out.push_back(make_counting_reporter());
  // A watched run's reporter writes the ledger (with the DHT's records folded in).
  if (g.node.http.empty())
    out.push_back(make_ledger_reporter());
  return out;
}

std::vector<std::string> bootstrap_from(const std::vector<size_t>& started, size_t self) {
  // The first nodes (long-lived in most runs) and the latest ones (alive most likely).
  std::vector<std::string> out;
  auto add = [&](size_t n) {
    auto a = fmt::format("@{}/dht", n);
    if (n != self && std::find(out.begin(), out.end(), a) == out.end())
      out.push_back(a);
  };
  for (size_t i = 0; i < std::min<size_t>(2, started.size()); ++i)
    add(started[i]);
  for (size_t i = started.size() > 2 ? started.size() - 2 : 0; i < started.size(); ++i)
    add(started[i]);
  return out;
}

run_result run_in_process(const experiment_graph& g, const role_registry& registry, run_mode mode,
                          const run_settings& settings) {
  auto p = make_plan(g, mode, settings.nodes, g.seed);
  if (!p) {
    fmt::print(stderr, "starling: error: {}\n", p.error().what);
    run_result r;
    r.exit_code = 2;
    return r;
  }
  if (mode == run_mode::sim)
    return run_sim(g, registry, *p, settings);
  return run_local(g, registry, *p, settings);
}

} // namespace starling::runtime
