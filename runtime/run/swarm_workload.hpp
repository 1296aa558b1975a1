// The `swarm` workload: SWARM pipeline training of a byte-level GPT on stage peers of different
// speeds, with preemptions and restarts, in one process (local mode).
#pragma once

#include <vector>

#include "kernels/compress/format.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/optim/optimizer.hpp"
#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// Options of the `swarm` section (configs/swarm-tiny.yaml documents each key).
struct swarm_options {
  kernels::gpt_config model;
  /// Per stage, the speed of each of its peers (1 = full speed, 0.5 = half).
  std::vector<std::vector<double>> stages;
  int64_t trainers = 2;
  int64_t microbatch = 8;
  int64_t microbatches_per_trainer = 400;
  int64_t max_inflight = 2;
  int64_t local_batch = 32;
  kernels::optimizer_options optimizer;
  kernels::codec_id compression = kernels::codec_id::blockwise8;
  std::chrono::nanoseconds hop_timeout = std::chrono::seconds(10);
  /// Mean time between preemptions of a random stage peer (0 = none).
  std::chrono::nanoseconds preempt_every = std::chrono::seconds(20);
  std::chrono::nanoseconds restart_delay = std::chrono::seconds(5);
  /// Held-out batches of the evaluation at the start and the end.
  int64_t eval_batches = 8;
  /// LibTorch intra-op threads (per process).
  int64_t torch_threads = 1;
};

/// Reads the `swarm` section.
void read_options(config_node& n, swarm_options& out);

/// Runs the workload (local mode).
int run_swarm(const experiment_config& cfg, const run_context& ctx);

} // namespace starling::runtime
