// A node's progress store: which batches each of its trainers completed
// (`kernels::batch_progress` by trainer name), so that a trainer restarted on the node redoes
// exactly the batches that were not done. With a folder, every change is also written there
// (`<name>.progress`, replaced atomically) and the folder's files are read at the start: a
// stopped run continued with `--resume`, or a node restarted in the same folder, takes its
// trainers' progress up from them.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "kernels/data/batch_progress.hpp"
#include "kernels/result.hpp"

namespace starling::actors::trainer {

/// Options of a progress store.
struct progress_store_options {
  /// Folder of the `<name>.progress` files (created when missing); empty: memory only.
  std::string dir;
  /// Told why the folder's files could not be read; the store then quits with that error
  /// (never silently dropped: the trainers would redo, and so train twice, their done batches).
  std::function<void(const std::string&)> on_error;
  /// Told, once, why a change could not be written (a resumed run would redo batches).
  std::function<void(const std::string&)> on_warning;
};

/// Spawns a progress store. Protocol (trainer_options::progress):
/// - `(get_atom, std::string name) -> std::string`: the trainer's progress serialized
///   (`kernels::batch_progress::serialize`), empty when it has none;
/// - `(put_atom, std::string name, uint64_t total, uint64_t batch)`: batch `batch` of `total`
///   is done (progress kept for another total is resized first; a batch beyond the total is not
///   progress). Written to the folder when it is new and `name` is a plain file name (letters,
///   digits, '_', '-', '.'; no leading '.').
caf::actor spawn_progress_store(caf::actor_system& sys, progress_store_options opts);

/// The progress files of `dir` (`<name>.progress`) by name; none when the folder is missing; an
/// error naming the first file that does not parse.
result<std::map<std::string, kernels::batch_progress>> read_progress_dir(const std::string& dir);

} // namespace starling::actors::trainer
