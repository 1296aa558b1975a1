// The DHT at scale in the simulation (runtime/sim world, virtual time): N nodes joined one after
// another (each through a random earlier node), every link with its own one-way latency drawn
// uniformly from [10, 50] ms (seeded per link), then K keys stored from random nodes and read back
// from other random nodes, `concurrency` operations in flight at a time.
//
// Printed: store and get success rates, mean and max hops, mean and max simulated latency per
// operation, messages carried by the network, and the wall-clock time of each phase. Next to it,
// hivemind's published figures for 1024 peers (real network, its own setup): not comparable
// one to one (virtual time has no CPU or queuing cost; 10-50 ms links), but the same questions.
//
//   store ok  the put's result says at least one replica accepted it
//   get ok    the get found the record and its value is the one stored
//   hops      store: depth of the deepest peer that answered the lookup; get: depth at which the
//             value was first found (0 = the reading node held it)
//
// usage: bench_dht [nodes=1024] [keys=16384] [concurrency=256] [seed=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "runtime/sim/world.hpp"

using namespace starling;
using namespace starling::actors::dht;
using namespace std::chrono_literals;
using messages::dht_get_result;
using messages::dht_put_result;
namespace sim = starling::runtime::sim;
using wall = std::chrono::steady_clock;

namespace {

/// Aggregates of one phase (stores or gets).
struct phase_stats {
  uint64_t issued = 0;
  uint64_t done = 0;
  uint64_t ok = 0;
  uint64_t hops_sum = 0;
  uint32_t hops_max = 0;
  double latency_sum_s = 0;
  double latency_max_s = 0;
  double wall_s = 0;
  double virtual_s = 0;

  void add(bool success, uint32_t hops, double latency_s) {
    ++done;
    if (!success)
      return;
    ++ok;
    hops_sum += hops;
    hops_max = std::max(hops_max, hops);
    latency_sum_s += latency_s;
    latency_max_s = std::max(latency_max_s, latency_s);
  }
  double rate() const { return issued ? 100.0 * static_cast<double>(ok) / issued : 0; }
  double mean_hops() const { return ok ? static_cast<double>(hops_sum) / ok : 0; }
  double mean_latency() const { return ok ? latency_sum_s / static_cast<double>(ok) : 0; }
};

double seconds_now(caf::event_based_actor* self) {
  return static_cast<double>(dht_now_ns(self)) * 1e-9;
}

std::vector<char> value_for(size_t i) {
  auto s = "value-" + std::to_string(i);
  return {s.begin(), s.end()};
}

size_t parse(int argc, char** argv, int i, size_t dflt) {
  if (argc <= i)
    return dflt;
  char* end = nullptr;
  auto v = std::strtoull(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v == 0) {
    std::fprintf(stderr, "bad argument '%s': expected a positive integer\n", argv[i]);
    std::exit(2);
  }
  return static_cast<size_t>(v);
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string{argv[1]} == "-h" || std::string{argv[1]} == "--help")) {
    std::printf("usage: bench_dht [nodes=1024] [keys=16384] [concurrency=256] [seed=1]\n");
    return 0;
  }
  const size_t nodes = parse(argc, argv, 1, 1024);
  const size_t keys = parse(argc, argv, 2, 16384);
  const size_t concurrency = parse(argc, argv, 3, 256);
  const uint64_t seed = parse(argc, argv, 4, 1);

  sim::world_options wo;
  wo.seed = seed;
  wo.trace_messages = false;
  wo.network.defaults.latency = 10ms;
  sim::world w{wo};
  w.network().set_latency_range(10ms, 50ms);

  // -- join -----------------------------------------------------------------------------------
  auto t0 = wall::now();
  std::mt19937_64 rng{seed};
  dht_options base;
  for (size_t i = 0; i < nodes; ++i) {
    auto& node = w.add_node("n" + std::to_string(i));
    auto opts = base;
    opts.address = node.endpoint() + "/dht";
    opts.id = identity::from_seed(seed * 1'000'003 + i);
    if (i > 0)
      opts.bootstrap = {"n" + std::to_string(rng() % i) + ":1/dht"};
    node.on_start([opts](sim::sim_node& nd) { nd.spawn("dht", dht_actor, nd.resolver(), opts); });
    // A join is a ping and a lookup of the own id: a few round trips of at most 100 ms.
    w.run_for(300ms);
  }
  w.run_for(2s);
  double join_wall = std::chrono::duration<double>(wall::now() - t0).count();
  double join_virtual = std::chrono::duration<double>(w.elapsed()).count();

  // -- store, then get ------------------------------------------------------------------------
  std::vector<std::string> names(keys);
  std::vector<size_t> writer(keys);
  for (size_t i = 0; i < keys; ++i) {
    names[i] = "bench-key-" + std::to_string(i) + "-" + std::to_string(rng());
    writer[i] = rng() % nodes;
  }
  auto expiration = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        w.system().clock().now().time_since_epoch())
                        .count() +
                    int64_t{24} * 3600 * 1'000'000'000;

  // Runs `op(i, stats)` for every key, at most `concurrency` in flight at a time.
  auto run_phase = [&](phase_stats& st, auto op) {
    auto start_wall = wall::now();
    auto start_virtual = w.elapsed();
    for (size_t first = 0; first < keys; first += concurrency) {
      auto last = std::min(keys, first + concurrency);
      for (size_t i = first; i < last; ++i) {
        ++st.issued;
        op(i, st);
      }
      w.run_until([&] { return st.done == last; }, 600s);
      if (st.done != last) {
        std::fprintf(stderr, "operations did not finish within 600 s of virtual time\n");
        std::exit(1);
      }
    }
    st.wall_s = std::chrono::duration<double>(wall::now() - start_wall).count();
    st.virtual_s = std::chrono::duration<double>(w.elapsed() - start_virtual).count();
  };

  phase_stats stores;
  run_phase(stores, [&](size_t i, phase_stats& st) {
    auto& nd = w.node(static_cast<int>(writer[i]));
    auto d = nd.lookup("dht");
    auto put = make_put(names[i], value_for(i), expiration);
    nd.spawn("", [&st, d, put](caf::event_based_actor* self) {
      auto begin = seconds_now(self);
      dht_store(
          self, d, put, 60s,
          [&st, self, begin](const dht_put_result& r) {
            st.add(r.accepted > 0, r.hops, seconds_now(self) - begin);
            self->quit();
          },
          [&st, self](caf::error&) {
            st.add(false, 0, 0);
            self->quit();
          });
      return caf::behavior{[](int) {}};
    });
  });

  phase_stats gets;
  run_phase(gets, [&](size_t i, phase_stats& st) {
    auto reader = rng() % nodes;
    if (nodes > 1 && reader == writer[i])
      reader = (reader + 1) % nodes;
    auto& nd = w.node(static_cast<int>(reader));
    auto d = nd.lookup("dht");
    auto expected = value_for(i);
    nd.spawn("", [&st, d, key = names[i], expected](caf::event_based_actor* self) {
      auto begin = seconds_now(self);
      dht_get(
          self, d, key, 60s,
          [&st, self, begin, expected](const dht_get_result& r) {
            bool ok = r.found && !r.records.empty() && r.records[0].value == expected;
            st.add(ok, r.hops, seconds_now(self) - begin);
            self->quit();
          },
          [&st, self](caf::error&) {
            st.add(false, 0, 0);
            self->quit();
          });
      return caf::behavior{[](int) {}};
    });
  });

  // -- report ---------------------------------------------------------------------------------
  std::printf("DHT in simulation: %zu nodes, %zu keys, %zu operations in flight, links 10-50 ms "
              "(per link, seed %llu), k=%zu alpha=%zu replicas=%zu\n",
              nodes, keys, concurrency, static_cast<unsigned long long>(seed),
              base.routing.k, base.alpha, base.num_replicas);
  std::printf("join: %.1f s wall, %.1f s virtual\n", join_wall, join_virtual);
  std::printf("%-7s %9s %10s %10s %14s %14s %10s %12s\n", "phase", "success", "mean hops",
              "max hops", "mean latency", "max latency", "wall s", "virtual s");
  auto row = [](const char* name, const phase_stats& st) {
    std::printf("%-7s %8.2f%% %10.2f %10u %12.4f s %12.4f s %10.1f %12.1f\n", name, st.rate(),
                st.mean_hops(), st.hops_max, st.mean_latency(), st.latency_max_s, st.wall_s,
                st.virtual_s);
  };
  row("store", stores);
  row("get", gets);
  std::printf("hivemind reference (1024 peers, real network, its own setup): store 100%% success,"
              " 0.0149 s mean per store; get 100%% success, 0.0066 s mean per get\n");
  std::printf("total wall-clock: %.1f s\n",
              std::chrono::duration<double>(wall::now() - t0).count());
  return 0;
}
