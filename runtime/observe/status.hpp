// `/status`: a snapshot as JSON — the run (experiment, kind, mode, nodes, start time, seed), the
// same families as `/metrics` (so both answers of one version agree), the instances and the loss
// curve, and the contribution ledger's first `max_status_ledger_rows` rows (`ledger_rows` says
// how many there are; `/ledger.csv` has them all). NaN and infinities, which JSON lacks, become null.
#pragma once

#include <cstddef>
#include <string>

namespace starling::runtime::observe {

struct snapshot;

/// Ledger rows `/status` carries at most.
inline constexpr size_t max_status_ledger_rows = 200;

/// The snapshot as one JSON object (see the file comment for its parts).
std::string render_status(const snapshot& s);

} // namespace starling::runtime::observe
