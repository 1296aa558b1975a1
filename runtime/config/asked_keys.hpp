// A recorder of the key paths the config reader is asked for, present in the file or not, so that
// a test can check configs/reference.yaml against what the readers really read. Off by default;
// off, each ask costs one relaxed atomic load.
//
// Paths are recorded normalized: a list index becomes `[]` (`swarm.stages[1].peers` ->
// `swarm.stages[].peers`), and a key of a free-form map (one read with `config_node::keys()`,
// such as `roles:` or `placement:`, whose keys are names the file chooses) becomes `*`
// (`roles.echo.type` -> `roles.*.type`).
//
// It is global on purpose (an exception to "no global mutable state"): the readers are free
// functions spread over every kind, and threading a recorder through all of them would change
// every signature for the sake of one test.
#pragma once

#include <atomic>
#include <set>
#include <string>

namespace starling::runtime::asked_keys {

namespace detail {

/// True while recording; read before any path is built.
inline std::atomic<bool> on{false};

} // namespace detail

/// True while recording.
inline bool recording() noexcept {
  return detail::on.load(std::memory_order_relaxed);
}

/// Clears what was recorded and starts recording.
void start();

/// Stops recording (what was recorded stays readable).
void stop();

/// Records that `path` (as `config_node::path()` spells it) was asked for.
void record(const std::string& path);

/// Records that the map at `path` is free-form: its keys are names, normalized to `*`.
void record_free_form(const std::string& path);

/// Every path asked for since `start()`, normalized (free-form keys as `*`).
std::set<std::string> recorded();

/// Normalizes `path` with the free-form maps recorded so far: `[3]` -> `[]`, and the key after a
/// free-form map's path -> `*`.
std::string normalize(const std::string& path);

} // namespace starling::runtime::asked_keys
