// Metrics: what roles report to their node's sink (runtime/experiment), which stamps the time,
// writes one JSON line per event and hands it to the run's reporters.
#pragma once

#include <map>
#include <string>

#include <caf/meta/type_name.hpp>

#include "messages/enveloped.hpp"

namespace starling::messages {

/// One measured event of a role instance.
struct metric_event {
  /// The instance that reports (`trainer.0`), or a host service (`node2/supervisor`).
  std::string source;
  /// What happened (`microbatch`, `restart`, `round`, ...): reporters dispatch on it.
  std::string kind;
  /// Numbers (`loss`, `samples`, `seconds`).
  std::map<std::string, double> values;
  /// Words (`peer`, `stage`, `reason`).
  std::map<std::string, std::string> labels;
  /// Run time in seconds when the first sink got it (set by that sink; negative until then),
  /// so that an event forwarded to another node keeps the time it happened.
  double t = -1;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<metric_event> {
  static constexpr const char* name = "metric";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const metric_event& x);
  static status read(const payload_reader& r, metric_event& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metric_event& x) {
  return inspect_enveloped(f, x, "metric_event", [&] {
    return f(caf::meta::type_name("metric_event"), x.source, x.kind, x.values, x.labels, x.t);
  });
}

} // namespace starling::messages
