// The commands that run an experiment graph, shared by `starling` (graphs from YAML files) and
// programs that build their graph in C++ (`experiment_main`): run in-process (simulation or
// local mode), print the plan, and run one cluster node — under a parent process that kills and
// restarts it when the plan says so.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

class node;

/// `run`: runs the graph in this process and prints its report; returns the exit code. The
/// output folder is created here, after everything validated (`out` empty: runs/<time>-<name>);
/// `source_text` (the experiment file as run) is kept in it as experiment.yaml, and `run.json`
/// records the run (experiment, kind, seed, mode, how many runs). An `out` that holds a run
/// already is refused unless `resume`: then the run there continues (same experiment, kind, seed
/// and mode; the kind must keep its state in the folder), its earlier results moved to
/// `<out>/run<k>/`.
int command_run(const experiment_graph& g, const role_registry& registry, run_mode mode,
                size_t nodes, const std::string& out, const std::string& source_text = {},
                bool resume = false);

/// `plan`: prints the plan of `g` for `nodes` nodes in `mode`.
int command_plan(const experiment_graph& g, const role_registry& registry, run_mode mode,
                 size_t nodes);

/// `node --index I --nodes N`: one cluster node's settings.
struct node_command {
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;
  size_t index = 0;
  size_t count = 1;
  /// No `--index`: a volunteer that takes one of the plan's open slots.
  bool volunteer = false;
  std::string out;
  /// Set in a child started by the parent process (hidden flags): its incarnation and the run
  /// time that passed before it.
  int incarnation = 0;
  int64_t elapsed_ms = 0;
  bool child = false;
  /// `--authority`, `--token` and `--key` (override the experiment's node settings when set).
  std::string authority;
  std::string token;
  std::string key;
  /// The command line that started this process (the parent re-runs it for its child).
  std::vector<std::string> argv;
  /// The experiment file and its `--set` overrides: the node serves them to joiners
  /// (runtime/experiment/serve.hpp; none when empty).
  std::string config_file;
  std::vector<std::string> sets;
};

/// Registers the experiment server of `file` (with `sets`, `nodes`) on `nd` and says so in one
/// line (`who`: the node's name); a file that cannot be served is a warning, not a failure.
void serve_experiment(node& nd, const std::string& file, const std::vector<std::string>& sets,
                      size_t nodes, const std::string& who);

/// A node that joins a run (`--join`) compares its experiment with the run's: the first node of
/// `join` that serves one is asked for its package. Another file, other overrides, other named
/// files or another node count is one line (what differs, both digests, the fix) and returns 2;
/// a node that cannot be asked is a warning, and 0 (the node goes on as before).
int compare_with_run(node& nd, const std::string& file, const std::vector<std::string>& sets,
                     size_t nodes, const std::vector<std::string>& join);

/// Prints whether `nd`'s run is open or closed (and encrypted), one line.
void print_admission(const node& nd);

/// Runs cluster node `cmd.index` of `g` until the run ends or SIGINT/SIGTERM. When the plan
/// kills this node (`kill_node` faults), this process becomes a parent that runs the node as a
/// child process, SIGKILLs it at the fault's time and starts it again (same port, next
/// incarnation) after the restart delay.
int command_node(const experiment_graph& g, const role_registry& registry,
                 const node_command& cmd);

/// A `main` for a program that builds its experiment in C++ with `build` and runs it in every
/// mode: `PROG [run] [--sim] [--seed S] [--nodes N] [--out DIR]`, `PROG plan [--sim|--cluster]
/// [--nodes N]`, `PROG node --index I --nodes N [--listen H:P] [--join H:P ...]`.
int experiment_main(int argc, char** argv, const role_registry& registry,
                    const std::function<result<experiment_graph>(run_mode)>& build);

} // namespace starling::runtime
