#include "runtime/cli/commands.hpp"
#include "runtime/run/kinds.hpp"

using namespace starling::runtime;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  auto reg = builtin_registry();
  return experiment_main(argc, argv, reg, [&](run_mode mode) {
    ping_options o;
    o.payload = 1024;  // bytes per ping
    o.interval = 500ms;
    experiment_builder b{"my-pings"};
    b.seed(7).duration(60s).nodes(4);
    b.role("echo", "ping.echo", o).replicas(4);
    b.role("pinger", "ping.pinger", o).replicas(4).colocate("echo");
    b.kill_node(2, 20s, restart_after{5s});  // node 2 and all on it, back 5 s later
    b.preempt("pinger", 15s);                // Poisson preemptions, seeded
    return b.build(reg, mode);
  });
}
