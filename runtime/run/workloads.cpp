#include "runtime/run/workload.hpp"

#include <fmt/format.h>

#include "runtime/run/masha_adversarial_workload.hpp"
#include "runtime/run/masha_workload.hpp"
#include "runtime/run/ping_workload.hpp"
#include "runtime/run/swarm_sim.hpp"
#include "runtime/run/swarm_workload.hpp"

namespace starling::runtime {

namespace {

/// A kind's `validate`: its own section reader, run on a copy of the options and discarded.
/// `local_only`: the kind has no simulation, so `--sim` (or `mode: sim`) is an error too.
template <class Options>
std::function<void(const experiment_config&, bool)> read_strictly(bool local_only) {
  return [local_only](const experiment_config& cfg, bool simulate) {
    if (!cfg.workload)
      return;
    auto section = *cfg.workload;
    Options opts;
    read_options(section, opts);
    section.finish();
    if (local_only && simulate)
      section.fail(fmt::format("the {} workload runs in local mode only (experiment.mode: local, "
                               "no --sim)",
                               section.path()));
  };
}

/// The `swarm` section: the graph, and its `sim` settings where present (in every mode, so a
/// typo there is found before a long local run).
void validate_swarm(const experiment_config& cfg, bool) {
  if (!cfg.workload)
    return;
  auto section = *cfg.workload;
  if (section.has("sim")) {
    auto sim = section.child("sim");
    validate_swarm_sim_section(sim);
  }
  graph::swarm_graph g;
  graph::read_swarm_graph(section, g);
  section.finish();
}

} // namespace

const std::map<std::string, workload>& workloads() {
  // The one table of experiment kinds; each entry lives in its own file.
  static const std::map<std::string, workload> table{
    {"masha",
     {"extragradient, MASHA1 and MASHA2 on a bilinear saddle point, as actors",
      read_strictly<masha_workload_options>(true), run_masha}},
    {"masha-adversarial",
     {"extragradient, MASHA1 and MASHA2 on adversarial training (Fashion-MNIST), as actors",
      read_strictly<masha_adversarial_options>(true), run_masha_adversarial}},
    {"ping",
     {"nodes exchange timed pings through the network model or loopback",
      read_strictly<ping_options>(false), run_ping}},
    {"swarm",
     {"SWARM pipeline training of a byte-level GPT with preemptions", validate_swarm, run_swarm,
      run_swarm_node}},
  };
  return table;
}

} // namespace starling::runtime
