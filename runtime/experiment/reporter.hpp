// Reporters: a kind's progress line, summary, tables and plots, attached to the graph instead of
// written inside a driver. Roles report metrics by message to their node's sink; the sink stamps
// the time, appends a JSON line and hands each event to the run's reporters (on node 0 in a
// cluster, where the other nodes' sinks forward theirs).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/fwd.hpp>

#include "runtime/experiment/graph.hpp"

namespace starling::runtime {

class host;
struct plan;

/// One metric as the reporters see it.
struct metric_record {
  /// Seconds since the run started (virtual in simulation) when the sink got it.
  double t = 0;
  /// The node whose sink got it first.
  size_t node = 0;
  std::string source;
  std::string kind;
  std::map<std::string, double> values;
  std::map<std::string, std::string> labels;

  /// A value, or `fallback` when absent.
  double value(const std::string& key, double fallback = 0) const;
  /// A label, or "" when absent.
  const std::string& label(const std::string& key) const;
};

/// What a reporter knows about its run.
struct run_info {
  const experiment_graph* graph = nullptr;
  const struct plan* plan = nullptr;
  run_mode mode = run_mode::local;
  /// Folder for metrics, traces and plots (exists).
  std::string out_dir;
  /// Progress updates in place on a terminal; a line every few seconds otherwise.
  bool tty = false;
};

/// What a reporter may do at the end of the run, while the roles still live.
class finish_context {
public:
  virtual ~finish_context();
  /// The live instances of `role` (resolved through the reporting node).
  virtual std::vector<caf::actor> live(const std::string& role) = 0;
  /// Runs `body` in a fresh event-based actor and waits (on CAF's clock: virtual time in
  /// simulation) until that actor quits or `timeout` passes; `body` makes its requests with
  /// typed handlers and quits when it has its answers (see `ask` below).
  virtual void run(std::function<void(caf::event_based_actor*)> body,
                   std::chrono::nanoseconds timeout) = 0;
  /// The reporting node's host (its services: the DHT, a board).
  virtual host& node() = 0;
  /// Seconds of run time and of wall time the run took.
  double run_s = 0;
  double wall_s = 0;
  /// True when the run ended at its duration rather than because a reporter said it was done.
  bool timed_out = false;
  /// True when a signal stopped it.
  bool stopped = false;
};

/// Asks `whom` with `xs...` and returns the reply (of types `Ts...`), or nothing on an error or
/// after `timeout`.
template <class... Ts, class... Args>
std::optional<std::tuple<Ts...>> ask(finish_context& ctx, const caf::actor& whom,
                                     std::chrono::nanoseconds timeout, Args... xs) {
  auto out = std::make_shared<std::optional<std::tuple<Ts...>>>();
  ctx.run(
    [=](caf::event_based_actor* self) {
      self->request(whom, std::chrono::duration_cast<caf::timespan>(timeout), xs...)
        .then(
          [=](Ts&... ys) {
            *out = std::make_tuple(std::move(ys)...);
            self->quit();
          },
          [=](caf::error&) { self->quit(); });
    },
    timeout + std::chrono::seconds(1));
  return *out;
}

/// A kind's report. Calls come from one thread at a time.
class reporter {
public:
  virtual ~reporter();
  /// Before the first metric.
  virtual void start(const run_info& info);
  /// Every metric of the run, in the order the reporting node's sink got them.
  virtual void on_metric(const metric_record& m);
  /// About once per second of run time: print progress; true ends the run (work complete).
  virtual bool tick(double t);
  /// After the run: summary, tables, plots. Returns the run's exit code (0 = success).
  virtual int finish(finish_context& ctx);
  /// A metric that came after `finish` began (the roles' last events, until they stop),
  /// possibly while `finish` runs on another thread: a reporter that takes it guards its state.
  virtual void on_late_metric(const metric_record& m);
  /// Once the run's actors stopped and every metric was delivered (`metric_hub::close`): files
  /// that must hold the run's last events (the ledger's).
  virtual void close();
};

/// Counts metrics by kind and prints them at the end: the report of a plain graph.
std::unique_ptr<reporter> make_counting_reporter();

} // namespace starling::runtime
