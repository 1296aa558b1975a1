// The LibTorch backend: the stage module of a registered model (kernels/models/registry.hpp)
// computes forward and backward passes in the call and measures its own device time.
#pragma once

#include <memory>

#include "actors/stage/backend.hpp"
#include "kernels/models/registry.hpp"

namespace starling::actors::stage {

/// What the LibTorch backend builds.
struct torch_backend_options {
  /// The model (name and options) and the registry it is found in (null: the built-ins).
  kernels::model_spec model;
  std::shared_ptr<const kernels::model_registry> models;
  /// The blocks held: [begin, end).
  int64_t begin = 0;
  int64_t end = 1;
  /// How one call's device seconds are measured; empty: the wall time of the call (the
  /// device's own time, read from the steady clock here and nowhere in the stage). Tests pass a
  /// fixed cost to make the emulated speed deterministic.
  device_timer timer;
  /// > 0: the device time is modeled, not measured (simulation with real compute): a forward
  /// costs `modeled_forward_s` per sample, a backward `modeled_backward_factor` times that,
  /// and none of it counts as time the clock saw pass (`ran_s` = 0), so on CAF's virtual clock
  /// the run is as fast as the model says and the same for every run of a seed.
  double modeled_forward_s = 0;
  double modeled_backward_factor = 2.0;
};

/// The device seconds of `work` by the steady clock.
double measure_wall_time(const std::function<void()>& work);

/// Builds the stage module of blocks [begin, end); fails on an unknown model, options of the
/// wrong type, or a range outside the model.
result<std::unique_ptr<backend>> make_torch_backend(torch_backend_options opts);

} // namespace starling::actors::stage
