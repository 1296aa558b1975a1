// Workloads that `starling run` can execute, looked up by `experiment.kind`.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "runtime/config/config.hpp"

namespace starling::runtime {

/// What `starling run` passes to a workload besides its config.
struct run_context {
  /// Folder for metrics JSONL, traces and plots (created by the caller).
  std::string out_dir;
  /// True when `--sim` was given or `experiment.mode` is `sim`.
  bool simulate = false;
};

/// A runnable experiment kind: reads its own section (`cfg.workload`), runs, prints a summary,
/// returns the process exit code. Config errors are thrown as config_error.
struct workload {
  std::string summary;
  std::function<int(const experiment_config&, const run_context&)> run;
};

/// Every workload starling knows, by kind.
const std::map<std::string, workload>& workloads();

} // namespace starling::runtime
