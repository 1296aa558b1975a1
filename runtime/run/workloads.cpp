#include "runtime/run/workload.hpp"

#include "runtime/run/masha_adversarial_workload.hpp"
#include "runtime/run/masha_workload.hpp"
#include "runtime/run/ping_workload.hpp"
#include "runtime/run/swarm_workload.hpp"

namespace starling::runtime {

const std::map<std::string, workload>& workloads() {
  // The one table of experiment kinds; each entry lives in its own file.
  static const std::map<std::string, workload> table{
    {"masha",
     {"extragradient, MASHA1 and MASHA2 on a bilinear saddle point, as actors", run_masha}},
    {"masha-adversarial",
     {"extragradient, MASHA1 and MASHA2 on adversarial training (Fashion-MNIST), as actors",
      run_masha_adversarial}},
    {"ping", {"nodes exchange timed pings through the network model or loopback", run_ping}},
    {"swarm",
     {"SWARM pipeline training of a byte-level GPT with preemptions", run_swarm, run_swarm_node}},
  };
  return table;
}

} // namespace starling::runtime
