// `/status`: a snapshot as JSON — the run (experiment, kind, mode, nodes, start time, seed), the
// same families as `/metrics` (so both answers of one version agree), the instances and the loss
// curve. NaN and infinities, which JSON lacks, become null.
#pragma once

#include <string>

namespace starling::runtime::observe {

struct snapshot;

/// The snapshot as one JSON object (see the file comment for its parts).
std::string render_status(const snapshot& s);

} // namespace starling::runtime::observe
