// Typed, validated options of an experiment file (see configs/reference.yaml for every key).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/config/reader.hpp"

namespace starling::runtime {

using namespace std::chrono_literals;

/// CAF's own settings; 0.17.6 leaves heartbeats and connection timeouts off unless set.
struct caf_options {
  /// `stealing` (CAF's default) or `sharing` (fewer idle polling threads next to LibTorch).
  std::string scheduler_policy = "stealing";
  /// Scheduler worker threads.
  int64_t max_threads = 2;
  /// How often a node sends BASP heartbeats to connected nodes.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A connected node silent for this long is considered dead (its actors go down).
  std::chrono::milliseconds connection_timeout{5000};
};

/// Where a node listens and whom it contacts first.
struct node_options {
  /// `HOST:PORT` to publish on; port 0 lets the OS choose.
  std::string listen = "127.0.0.1:0";
  /// `HOST:PORT` of nodes to connect to at start.
  std::vector<std::string> join;
  /// Open a direct data endpoint for bulk tensor transfers (actors/transfer/data_channel.hpp)
  /// beside BASP. Only where `listen` is a loopback host: other nodes use BASP chunks.
  bool data_endpoint = true;
};

/// One simulated link direction.
struct link_options {
  /// One-way propagation delay.
  std::chrono::nanoseconds latency = 20ms;
  /// Bytes per second; transfers on a link queue behind each other.
  double bandwidth = 100e6;
  /// Probability that a message is dropped.
  double loss = 0.0;
};

/// A link between two simulated nodes that differs from the default.
struct link_override {
  std::string from;
  std::string to;
  link_options link;
};

/// The simulation's network model.
struct network_options {
  link_options defaults;
  std::vector<link_override> links;
};

/// One scheduled fault.
struct fault_event {
  /// Time since the start of the run.
  std::chrono::nanoseconds at{0};
  /// `kill_node`, `kill_actor`, `restart_node`, `partition` or `heal`.
  std::string action;
  /// Node (or actor name for kill_actor) the fault applies to.
  std::string target;
  /// Second node, for partition/heal.
  std::string peer;
  /// For kills: restart after this delay; negative = use faults.restart_delay; `never` = -2.
  std::chrono::nanoseconds restart_after{-1};
};

/// Failures injected into a run, from a seeded rate and/or an explicit schedule.
struct fault_options {
  /// Random preemptions per node per hour (0 = none).
  double preemptions_per_hour = 0.0;
  /// Delay before a preempted node restarts.
  std::chrono::nanoseconds restart_delay = 5s;
  /// Explicit faults, in addition to random ones.
  std::vector<fault_event> schedule;
};

/// What the experiment is and how it runs.
struct experiment_options {
  /// A name for logs and the output folder.
  std::string name = "experiment";
  /// Which workload runs; the file holds a section of the same name with its options.
  std::string kind;
  /// Seed of every random choice in the run.
  uint64_t seed = 42;
  /// `local` (one process, real time), `sim` (virtual time) or `cluster`.
  std::string mode = "local";
  /// How long the run lasts (wall or virtual time, by mode).
  std::chrono::nanoseconds duration = 60s;
  /// Log level: `debug`, `info`, `warning` or `error`.
  std::string log_level = "info";
};

/// A whole experiment file.
struct experiment_config {
  experiment_options experiment;
  caf_options caf;
  node_options node;
  network_options network;
  fault_options faults;
  /// The section named after `experiment.kind`, read by that workload's own loader.
  std::optional<config_node> workload;
  /// The whole file as read, after `--set` overrides (what `save_experiment` writes).
  YAML::Node document;
};

/// How `load_experiment` reads a file.
struct load_options {
  /// `key.path=value` assignments applied in order before the file is read (`--set`).
  std::vector<std::string> overrides;
  /// The experiment kinds there are; when not empty, `experiment.kind` must name one of them.
  std::vector<std::string> kinds;
};

/// Reads each options struct from its section (absent keys keep their defaults).
void read_options(config_node& n, caf_options& out);
void read_options(config_node& n, node_options& out);
void read_options(config_node& n, link_options& out);
void read_options(config_node& n, network_options& out);
void read_options(config_node& n, fault_options& out);
void read_options(config_node& n, experiment_options& out);

/// Parses a whole experiment; throws config_error naming file, line and key on bad input. Every
/// top-level key must be a known section or the kind's (checked before any section is read, so a
/// misspelt section is reported as such); `kinds` as in `load_options`. The kind's own section
/// is left to the kind (`workload::validate`).
experiment_config parse_experiment(config_node root, const std::vector<std::string>& kinds = {});

/// Loads an experiment file, applies `opts.overrides`, and parses it; every error is one line
/// `file:line: key: what went wrong` (or `--set ARG: what went wrong`).
result<experiment_config> load_experiment(const std::string& path, const load_options& opts = {});

/// Writes the experiment as it runs to `to`: a copy of `file`, or, when `overrides` is not empty,
/// `cfg.document` headed by a comment with the `--set` arguments (the file's comments are lost).
status save_experiment(const std::string& file, const experiment_config& cfg,
                       const std::vector<std::string>& overrides, const std::string& to);

/// Splits `HOST:PORT` (port 0–65535); failure names the bad part.
result<std::pair<std::string, uint16_t>> parse_endpoint(const std::string& text);

} // namespace starling::runtime
