// The MASHA / extragradient actors: one server and M workers, thin shells around
// `server_core` / `worker_core` (masha.hpp). The server drives rounds by request with timeouts and
// monitors every worker, so a lost worker either fails the run or is dropped — never a hang.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/vi/masha.hpp"

namespace starling::actors::vi {

/// What the server does when a worker dies or stops answering.
enum class worker_loss_policy {
  /// The run fails with an error naming the worker.
  fail,
  /// The run continues with the remaining workers (F becomes their average).
  continue_run,
};

/// Options of the server actor.
struct server_options {
  /// The method's options (the same the workers got).
  method_options method;
  /// Reaction to a lost worker.
  worker_loss_policy on_worker_loss = worker_loss_policy::fail;
  /// How long the server waits for one worker's reply in a round.
  std::chrono::milliseconds timeout{5000};
};

/// Spawns worker `index` of `problem`, starting at z = 0. It answers
/// (vi_step_atom, vi_downlink, bool apply) → vi_uplink and (vi_finish_atom, vi_downlink) → vi_report.
caf::actor spawn_worker(caf::actor_system& sys, std::shared_ptr<const vi_problem> problem,
                        std::size_t index, const method_options& options);

/// Spawns the server for vectors of length `dim` over `workers` (which it monitors). It answers
/// (vi_run_atom, uint64_t iterations) → vi_report (a later request continues for that many more
/// iterations; the report is cumulative), or an error when a worker is lost under
/// `worker_loss_policy::fail` (or no worker is left).
caf::actor spawn_server(caf::actor_system& sys, std::size_t dim, std::vector<caf::actor> workers,
                        const server_options& options);

} // namespace starling::actors::vi
