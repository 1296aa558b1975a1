// What every BTARD peer computes on: a model with flat float32 parameters and a labeled data set,
// with the gradient of a public batch as a pure function of (parameters, batch seed). Peers,
// validators and re-checkers call the same function, so in one process a recomputed gradient is
// bit for bit the one the honest peer sent (one LibTorch thread, same code path); across
// machines it is not, and validators compare with a tolerance there.
//
// The batch of a seed is `kernels::batch_for_step` of a loader seeded with it (one shard, step
// 0): one fixed batch per peer per step, which anyone can recompute from the step's shared
// randomness and the peer's key (mprng.hpp's batch_seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::kernels {
class data_source;
} // namespace starling::kernels

namespace starling::actors::btard {

/// Accuracy and loss of parameters on the held-out set.
struct task_evaluation {
  double accuracy = 0.0;
  double loss = 0.0;
};

/// A model and its data, as BTARD peers see them.
class task {
public:
  virtual ~task() = default;
  /// Parameters in the flat vector.
  virtual size_t dim() const = 0;
  /// The starting parameters every peer holds (from the run's seed).
  virtual std::vector<float> initial() const = 0;
  /// The gradient of the batch `batch_seed` names at `params` (mean cross-entropy), labels
  /// flipped (y → classes − 1 − y) when asked (the label-flip attack). Fails on a parameter
  /// vector of the wrong size.
  virtual result<std::vector<float>> gradient(const std::vector<float>& params, uint64_t batch_seed,
                                              bool flip_labels) const = 0;
  /// The sample ids of `batch_seed`'s batch.
  virtual result<std::vector<uint64_t>> batch_ids(uint64_t batch_seed) const = 0;
  /// Accuracy and loss on the held-out set.
  virtual task_evaluation evaluate(const std::vector<float>& params) const = 0;
  /// One line: model, data, batch.
  virtual std::string describe() const = 0;
};

/// An MLP classifier inputs → hidden (ReLU) → classes.
struct mlp_task_options {
  /// Hidden width.
  int64_t hidden = 64;
  /// Samples per peer per step.
  uint64_t batch = 32;
  /// Seed of the initial parameters.
  uint64_t seed = 0;
  /// Held-out samples evaluated (0: all).
  uint64_t eval_samples = 0;
};

/// Checks the options (hidden >= 1, batch >= 1).
status validate(const mlp_task_options& o);

/// The MLP on `train` (labeled images, flattened) evaluated on `eval` (null: `train`). Fails on
/// a source that is not a labeled one-dimensional sample set.
result<std::shared_ptr<const task>> make_mlp_task(std::shared_ptr<const kernels::data_source> train,
                                                  std::shared_ptr<const kernels::data_source> eval,
                                                  const mlp_task_options& o);

} // namespace starling::actors::btard
