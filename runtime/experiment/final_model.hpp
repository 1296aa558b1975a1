// The final model of a run, as every reporter takes it at the end: choose the peer (the live one
// with the most steps), download its state through the one download client, evaluate the model
// loaded with it (the kind's own evaluation), and export it (TorchScript files, state dicts and
// `export.json`). Every wait is on the finish context's clock (virtual time in simulation): no
// sleeps.
//
// A reporter calls, in order: `survey_peers` (each live peer's counters), `download_most_trained`
// (the state of the one with the most steps; the next ones in turn when asked to), its own
// evaluation, and `export_final_model`. `pass_time` waits for restarted peers between two surveys.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <nlohmann/json_fwd.hpp>

#include "actors/collab/state_download.hpp"
#include "kernels/result.hpp"
#include "runtime/experiment/reporter.hpp"

namespace starling::kernels {
class stage_module;
} // namespace starling::kernels

namespace starling::runtime {

/// A live peer that answered the survey.
struct final_candidate {
  /// Its name (the board's, or `#<index>` when none was given).
  std::string name;
  caf::actor peer;
  /// Its `(status_atom)` counters.
  std::vector<uint64_t> counters;
  /// Its optimizer or global steps (the counter at `final_model_options::steps_at`).
  uint64_t steps = 0;
};

/// How the final model is chosen and downloaded.
struct final_model_options {
  /// Index of the steps among a peer's `(status_atom)` counters.
  size_t steps_at = 0;
  /// A peer that answers with fewer counters (or none past `steps_at`) is left out.
  size_t min_counters = 0;
  /// How long each peer may take to answer the survey.
  std::chrono::nanoseconds ask_timeout = std::chrono::seconds(5);
  /// How many of the most trained peers are asked for their state, one after another (most
  /// trained first) until one serves it.
  size_t donors = 1;
  /// The download's options; `download.timeout` bounds each donor.
  actors::collab::download_options download;
};

/// Asks each of `peers` for its counters (`(status_atom) -> std::vector<uint64_t>`), one after
/// another, and returns those that answered, in the given order; `each` (when set) runs for
/// every one as soon as it answered (to ask it more before the next peer is asked).
/// `names[i]` names `peers[i]` (`#<i>` past the end).
std::vector<final_candidate>
survey_peers(finish_context& ctx, const std::vector<caf::actor>& peers,
             const std::vector<std::string>& names, const final_model_options& opts,
             const std::function<void(const final_candidate&)>& each = {});

/// `candidates` most trained first (equal steps keep their order).
std::vector<final_candidate> rank_candidates(std::vector<final_candidate> candidates);

/// The state of the most trained of `candidates` (up to `opts.donors` of them, most trained
/// first, tried in turn); an error saying why none served it.
result<actors::collab::downloaded_state>
download_most_trained(finish_context& ctx, const std::vector<final_candidate>& candidates,
                      const final_model_options& opts);

/// The whole state of one peer (the download client, one donor), waited for at most `timeout`.
result<actors::collab::downloaded_state> download_from(finish_context& ctx, const caf::actor& peer,
                                                       std::chrono::nanoseconds timeout);

/// Lets `d` pass on the finish context's clock (virtual time in simulation, where the run's
/// actors go on meanwhile).
void pass_time(finish_context& ctx, std::chrono::nanoseconds d);

/// Writes `modules` (module k as stage k) into `dir` with `kernels::export_stage`, and
/// `dir/export.json`: `fields` with the written files' names under `files`. Returns those names;
/// an error naming the module or file that could not be written.
result<std::vector<std::string>>
export_final_model(const std::vector<kernels::stage_module*>& modules, const std::string& dir,
                   const nlohmann::json& fields);

} // namespace starling::runtime
