// The cost-model backend: computes nothing and says how long the device would take. A forward
// of b samples costs `forward_s * b` device seconds at speed 1 (a backward `backward_factor`
// times that), times a seeded lognormal noise of mean 1; replies carry placeholder tensors.
// Parameters are a small placeholder vector (a stage's true parameters and optimizer state are
// `state_bytes` on the network, never in memory): the peer steps, averages, gossips and hands
// it to newcomers exactly as a real peer its model, so those protocols run in simulation at the
// cost of a few floats, while a state transfer is charged the configured bytes.
#pragma once

#include <cstdint>
#include <memory>

#include "actors/stage/backend.hpp"

namespace starling::actors::stage {

/// The cost model's settings.
struct cost_model_options {
  /// Forward seconds per sample at speed 1 (> 0).
  double forward_s = 0.01;
  /// A backward costs this many forwards (> 0).
  double backward_factor = 2.0;
  /// Sigma of the per-request lognormal noise (0 = none; mean 1 either way).
  double noise = 0.0;
  /// Placeholder floats per sample in activations and gradients (>= 1): what the messages
  /// between stages weigh on the network.
  int64_t payload = 4;
  /// Bytes the stage's state (parameters and optimizer state) weighs in a transfer: a state
  /// download, a gossip exchange. Charged to the network, never allocated.
  uint64_t state_bytes = 0;
  /// Floats of placeholder parameters (>= 1): what the peer steps, averages and downloads.
  int64_t placeholder_params = 8;
};

/// The loss the last stage answers (ln 256: a uniform byte model).
inline constexpr double placeholder_loss = 5.545177444479562;

/// A cost model for a stage that holds blocks [begin, end) of a `depth`-block model; `seed`
/// seeds the noise, `init_seed` the placeholder parameters (equal for every peer of a stage,
/// as a real model's seeded initialization). Fails on values outside their ranges.
result<std::unique_ptr<backend>> make_cost_model(const cost_model_options& opts, int64_t depth,
                                                 int64_t begin, int64_t end, uint64_t seed,
                                                 uint64_t init_seed);

} // namespace starling::actors::stage
