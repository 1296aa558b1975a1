// Workloads that `starling run` can execute, looked up by `experiment.kind`.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"

namespace starling::runtime {

/// What `starling run` passes to a workload besides its config.
struct run_context {
  /// Folder for metrics JSONL, traces and plots (created by the caller).
  std::string out_dir;
  /// True when `--sim` was given or `experiment.mode` is `sim`.
  bool simulate = false;
};

class node;

/// What `starling node --config FILE --index I --nodes N` passes to a workload's cluster mode.
struct cluster_context {
  size_t index = 0;
  size_t count = 1;
  /// `host:port` of the nodes this one joined (DHT bootstrap).
  std::vector<std::string> join;
  std::string out_dir;
  /// True once the node was asked to stop (SIGINT/SIGTERM).
  std::function<bool()> stop;
};

/// A runnable experiment kind: reads its own section (`cfg.workload`), runs, prints a summary,
/// returns the process exit code. Config errors are thrown as config_error.
struct workload {
  std::string summary;
  /// Reads the kind's section strictly, as `run` and `cluster` will, and discards it; throws
  /// config_error. The CLI calls it before it creates anything. `simulate`: a `--sim` run.
  std::function<void(const experiment_config&, bool simulate)> validate;
  std::function<int(const experiment_config&, const run_context&)> run;
  /// Cluster mode (one `starling node` per process), where the kind supports it.
  std::function<int(const experiment_config&, node&, const cluster_context&)> cluster = {};
};

/// Every workload starling knows, by kind.
const std::map<std::string, workload>& workloads();

} // namespace starling::runtime
