// The YAML front door of the experiment graph: `experiment:`, `roles:`, `placement:`,
// `faults:`, `events:` (and `caf:`, `node:`, `network:`), or a kind shorthand (`swarm:`,
// `ping:`, `masha:`, ...) that expands into roles, faults and reporters and may be combined with
// the generic sections. Everything is read strictly: an unknown key anywhere, a key given twice,
// a fault naming an unknown role or a fault kind the mode does not support is one clear error
// naming the line, before anything is created.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

/// A graph read from a file, with the mode it runs in and its log level.
struct loaded_experiment {
  experiment_graph graph;
  run_mode mode = run_mode::local;
  std::string log_level = "info";
  /// The file it came from (after `--set` overrides, as YAML text), to keep beside the results.
  std::string source_text;
};

/// How the caller wants the file run.
struct graph_load_options {
  /// Forces a mode (`--sim` gives sim, `starling node` cluster); unset: `experiment.mode`.
  std::optional<run_mode> mode;
  /// Overrides `experiment.seed`.
  std::optional<uint64_t> seed;
  /// `--set key.path=value` overrides, applied to the YAML tree before anything is read.
  std::vector<std::string> overrides;
};

/// Reads the whole experiment from a parsed file; throws config_error naming the line.
loaded_experiment read_experiment(config_node root, const role_registry& registry,
                                  const graph_load_options& opts);

/// Loads, overrides, reads and validates an experiment file; the failure is one line
/// `file:line: key: what went wrong`.
result<loaded_experiment> load_experiment_file(const std::string& path,
                                               const role_registry& registry,
                                               const graph_load_options& opts);

/// Reads only a file's `caf:` and `node:` sections (strictly), for a bare `starling node` that
/// runs no experiment; the other sections are not looked at.
result<std::pair<caf_options, node_options>> load_node_settings(const std::string& path);

/// Reads one `faults:` item (exposed for kind shorthands that build faults from their own keys).
fault_spec read_fault(config_node& item);

} // namespace starling::runtime
