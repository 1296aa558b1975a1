// `/`: the run's live page. One self-contained HTML document (inline CSS and script, nothing
// fetched from elsewhere) that reads `/status` every 2 s and shows the run at a glance: the
// figures, the loss curve (an inline SVG drawn by the script), live instances by role, every
// instance with its samples, and faults and restarts.
#pragma once

#include <string>

namespace starling::runtime::observe {

/// The page (the same bytes for every run: it learns everything from `/status`).
const std::string& status_page();

} // namespace starling::runtime::observe
