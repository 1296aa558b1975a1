// A state download from a reporter at the end of a run (the final model, the spread of a stage's
// replicas): the one download client (actors/collab/state_download.hpp) run in a fresh actor of
// the reporting node, on CAF's clock (virtual time in simulation).
#pragma once

#include <chrono>

#include "actors/collab/state_download.hpp"
#include "kernels/result.hpp"
#include "runtime/experiment/reporter.hpp"

namespace starling::runtime {

/// Downloads a state from `donors` as `opts` says; waits at most `wait` (then, or when every
/// donor failed, the error says why).
result<actors::collab::downloaded_state> download_state(finish_context& ctx,
                                                        actors::collab::donor_source donors,
                                                        actors::collab::download_options opts,
                                                        std::chrono::nanoseconds wait);

} // namespace starling::runtime
