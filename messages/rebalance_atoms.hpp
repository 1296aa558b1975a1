// Atoms of adaptive rebalancing (kept apart from atoms.hpp, which nearly every file includes):
// a stage peer's throughput report to its board and the supervisor's placement notes
// (`load_atom`), the supervisor's periodic check, migration claims and "child migrated"
// (`migrate_atom`), and the trainer's probe of a stage peer's queue (`probe_atom`).
#pragma once

#include <caf/atom.hpp>

namespace starling {

using migrate_atom = caf::atom_constant<caf::atom("migrate")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
/// Trainer → stage peer: `(probe_atom) -> double`, the seconds of device time queued ahead of a
/// new request (answered at once, also while the device is busy).
using probe_atom = caf::atom_constant<caf::atom("probe")>;

} // namespace starling
