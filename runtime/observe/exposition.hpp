// The Prometheus text exposition format 0.0.4 (`text/plain; version=0.0.4`): the metric families
// of a snapshot, their rendering, and a strict parser of the format that the tests (and anyone
// checking a scrape) apply to what we serve.
//
// Names: `starling_*` in base units (`_seconds`), counters end in `_total` and never decrease,
// gauges hold live values. `/status` carries the same families as JSON (status.hpp), so both
// answers of one snapshot version hold the same numbers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/result.hpp"

namespace starling::runtime::observe {

struct snapshot;

/// One series of a family: its labels (in order) and value.
struct metric_sample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

/// One metric family: `counter`, `gauge` (or, when parsed, `untyped`, `histogram`, `summary`).
struct metric_family {
  std::string name;
  std::string help;
  std::string type;
  std::vector<metric_sample> samples;
};

/// The families of a snapshot, in a fixed order.
std::vector<metric_family> families_of(const snapshot& s);

/// The families as exposition text (HELP and TYPE before each family's samples, a final
/// newline, label values and help escaped, NaN and +Inf as the format spells them).
std::string render_exposition(const std::vector<metric_family>& families);

/// `render_exposition(families_of(s))`.
std::string render_metrics(const snapshot& s);

/// The content type `/metrics` answers with.
inline constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

/// Parses exposition text strictly: metric and label name syntax, HELP and TYPE exactly once per
/// family and before its samples, a family's samples together, label escapes (`\\`, `\"`, `\n`
/// only), no duplicate label or series, values as Go's ParseFloat writes them (`NaN`, `+Inf`,
/// `-Inf`), an optional integer timestamp, a final newline, counters named `_total` with
/// non-negative values. Fails with the line number and what was expected.
result<std::vector<metric_family>> parse_exposition(const std::string& text);

/// Fails when a counter series of `before` is missing from `after` or has a smaller value there.
status check_counters_grow(const std::vector<metric_family>& before,
                           const std::vector<metric_family>& after);

/// The value of the series `name` with exactly `labels`, or NaN when absent.
double find_sample(const std::vector<metric_family>& families, const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& labels = {});

} // namespace starling::runtime::observe
