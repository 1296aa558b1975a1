// configs/dedloc-fmnist.yaml (or, with `--diloco`, configs/diloco-fmnist.yaml) as a C++ graph:
// 8 data-parallel peers training an MLP on Fashion-MNIST together, speeds 1 to 0.25, the last 2
// in client mode, about 20% of them leaving per minute on a seeded schedule (each replaced 5 s
// later by a newcomer that downloads the state). The role, the churn schedule and the reporter
// are the `dedloc` kind's (runtime/run/dedloc.hpp).
//   example_dedloc [--diloco] [--sim] [--seed S]                  one process (local or simulated)
//   example_dedloc [--diloco] node --index I --nodes 8 [--join HOST:PORT]   one cluster node
#include <cstring>
#include <vector>

#include "runtime/cli/commands.hpp"
#include "runtime/run/dedloc.hpp"
#include "runtime/run/kinds.hpp"

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  // `--diloco` is ours; the rest goes to experiment_main.
  bool diloco = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--diloco") == 0)
      diloco = true;
    else
      args.push_back(argv[i]);
  }
  auto reg = builtin_registry();
  return experiment_main(static_cast<int>(args.size()), args.data(), reg, [&](run_mode mode) {
    dedloc_role_options o;
    o.speeds = {1.0, 0.9, 0.8, 0.7, 0.55, 0.45, 0.35, 0.25};
    o.cycle = 8;
    o.clients = 2;
    o.torch.optimizer.lr = 0.002;
    o.peer.compute_time = 40ms;
    if (diloco) {
      o.peer.algo = starling::actors::dp_peer::algorithm::diloco;
      o.peer.inner_batch = 128;
      o.peer.collab.progress.target_batch = 8192;
      o.peer.diloco.outer.momentum = 0;
      o.peer.diloco.outer.nesterov = false;
      o.peer.eval_every = 1;
    }
    experiment_builder b{diloco ? "diloco-fmnist" : "dedloc-fmnist"};
    b.seed(42).duration(3min).nodes(8);
    network_options net;
    net.defaults.latency = 20ms;
    net.defaults.bandwidth = 100e6 / 8; // 100 Mbit/s
    b.network(net);
    b.role("peers", "dedloc.peer", o).replicas(8);
    churn_spec churn;
    churn.role = "peers";
    churn.per_minute = 0.2;
    b.churn(churn);
    b.reporter([] { return make_dedloc_reporter(); });
    return b.build(reg, mode);
  });
}
