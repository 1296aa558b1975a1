// starling's averager (butterfly all-reduce over CAF/BASP) side by side with
// c10d::ProcessGroupGloo::allreduce in the same run: N processes on loopback, fp32 vectors.
//   gloo      ProcessGroupGloo over 127.0.0.1, FileStore rendezvous; allreduce (sum) timed.
//   starling  one runtime::node + DHT + averager per process; the averager's `round_ns` (group
//             message -> reply, i.e. the all-reduce without matchmaking) and the wall time of
//             the whole request (with matchmaking) are printed.
// Times are medians of `reps` rounds after one warm-up; RSS is each process's peak resident
// memory (the largest over the N processes is printed). Both run in fresh processes per row.
//
// "mse" is the mean squared error of the last round's result against the exact mean (computed
// after the peak RSS was taken).
//
// usage: bench_allreduce [--n 2,4] [--kinds starling,starling-fp16,starling-bw8]
//                        [--netns PREFIX] [reps] [sizes...]   (default 3; 1M and 16M floats)
//   --netns PREFIX  child r runs in network namespace PREFIX<r> at 10.77.0.<r+1> (set up, shaped
//                   and removed by scripts/netns-allreduce, which passes this option)
// env: STARLING_BENCH_BASP=1 (averager over BASP only), STARLING_BENCH_CHUNK_KIB=N (chunk
//      size), STARLING_BENCH_TRACE=1 (each child's RSS after every round, to stderr)
// children: bench_allreduce --child gloo|starling|starling-fp16|starling-bw8 RANK N NUMEL DIR REPS
//           (address from $STARLING_BENCH_HOST, default 127.0.0.1)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"

using namespace starling;
using clk = std::chrono::steady_clock;

namespace {

/// The address this child listens on: its namespace's in the netns run, else loopback.
std::string bench_host() {
  auto* h = std::getenv("STARLING_BENCH_HOST");
  return h && *h ? h : "127.0.0.1";
}

/// Mean squared error of `got` against the exact mean of the N inputs (rank r's input is
/// `randn(numel)` seeded with r), generated one at a time.
double mse_to_mean(const torch::Tensor& got, int n, int64_t numel) {
  auto mean = torch::zeros({numel});
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(r);
    mean.add_(torch::randn({numel}));
  }
  mean.div_(n);
  return got.defined() && got.numel() == numel
             ? (got.to(torch::kFloat).reshape({-1}) - mean).pow(2).mean().item<double>()
             : -1.0;
}

/// Resident memory now (VmRSS), for the baseline before the vector exists.
uint64_t current_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int child_gloo(int rank, int n, int64_t numel, const std::string& dir, int reps) {
  auto store = c10::make_intrusive<::c10d::FileStore>(dir + "/gloo.store", n);
  auto opts = ::c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForHostname(bench_host()));
  opts->timeout = std::chrono::seconds(120);
  ::c10d::ProcessGroupGloo pg(store, rank, n, opts);
  auto base = current_rss_bytes();
  torch::manual_seed(rank);
  auto x = torch::randn({numel});
  std::vector<double> times;
  torch::Tensor last;
  for (int i = 0; i <= reps; ++i) {
    std::vector<at::Tensor> ts{x.clone()};
    std::vector<at::Tensor> bar{torch::zeros({1})};
    pg.allreduce(bar)->wait(); // start together
    auto t0 = clk::now();
    pg.allreduce(ts)->wait();
    auto dt = std::chrono::duration<double>(clk::now() - t0).count();
    if (i > 0)
      times.push_back(dt);
    if (i == reps) // only the last result is kept (for the mse), as a caller that applies it would
      last = ts[0];
  }
  auto rss = runtime::peak_rss_bytes();
  auto mse = mse_to_mean(last / n, n, numel);
  fmt::print("RESULT {} {:.6f} {:.6f} {} 0 {:.3e} {}\n", rank, median(times), median(times), rss,
             mse, base);
  std::fflush(stdout);
  return 0;
}

std::string wait_file(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    std::ifstream f(path);
    std::string s;
    if (f >> s && !s.empty())
      return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

int child_starling(int rank, int n, int64_t numel, const std::string& dir, int reps,
                   kernels::codec_id codec) {
  runtime::caf_options caf_opts;
  caf_opts.scheduler_policy = "sharing";
  runtime::node_options node_opts;
  node_opts.listen = bench_host() + ":0";
  auto nd = runtime::node::start(caf_opts, node_opts, "bench" + std::to_string(rank));
  if (!nd) {
    fmt::print(stderr, "node: {}\n", nd.error().what);
    return 2;
  }
  auto& node = **nd;
  auto ep = node.endpoint();
  actors::dht::dht_options d;
  d.address = ep + "/dht";
  d.id = actors::dht::identity::from_seed(1000 + rank);
  if (rank == 0) {
    std::ofstream(dir + "/ep0.tmp") << ep << "\n";
    std::rename((dir + "/ep0.tmp").c_str(), (dir + "/ep0").c_str());
  } else {
    auto ep0 = wait_file(dir + "/ep0");
    d.bootstrap = {ep0 + "/dht"};
  }
  auto dht = actors::dht::spawn_dht(node.system(), node.resolver(), d);
  node.register_actor("dht", dht);
  actors::averager::averager_options a;
  a.address = ep + "/averager";
  a.target_group_size = static_cast<uint32_t>(n);
  a.matchmaking_window = std::chrono::seconds(5);
  a.poll_interval = std::chrono::milliseconds(50);
  a.round_timeout = std::chrono::seconds(120);
  // The averager's default chunk (1 MiB): resident memory grows with links x chunk size (each
  // incoming link holds up to 3 chunks); 4 MiB chunks were ~25% faster at N=4 but took 3.0x the
  // vector at 16M floats (N=8: 3.5x) against 2.5x.
  if (auto* c = std::getenv("STARLING_BENCH_CHUNK_KIB")) // chunk size experiments
    a.chunk_bytes = std::max<uint64_t>(4, std::strtoull(c, nullptr, 10) * 1024);
  a.window = 4;
  a.codec = codec;
  if (!std::getenv("STARLING_BENCH_BASP"))
    a.data_host = bench_host(); // the averager's data plane (STARLING_BENCH_BASP=1: BASP only)
  auto avg = actors::averager::spawn_averager(node.system(), dht, node.resolver(), a);
  node.register_actor("averager", avg);
  std::this_thread::sleep_for(std::chrono::milliseconds(500)); // DHT joins settle
  auto base = current_rss_bytes();
  torch::manual_seed(rank);
  auto x = torch::randn({numel});
  std::vector<double> rounds, walls;
  torch::Tensor last;
  int bad = 0;
  {
    caf::scoped_actor self{node.system()};
    for (int i = 0; i <= reps; ++i) {
      messages::tensor_list tl;
      tl.tensors.push_back(messages::tensor_msg{x, kernels::codec_id::none, {}, {}});
      auto t0 = clk::now();
      self->request(avg, std::chrono::seconds(300), average_atom::value, std::string("bench"), tl,
                    1.0)
          .receive(
              [&](messages::average_result& r) {
                auto wall = std::chrono::duration<double>(clk::now() - t0).count();
                if (r.report.outcome != messages::round_outcome::complete
                    || r.report.members.size() != static_cast<size_t>(n)) {
                  ++bad;
                  fmt::print(stderr, "rank {}: {}\n", rank,
                             actors::averager::summary(r.report));
                }
                if (i > 0) {
                  rounds.push_back(static_cast<double>(r.report.round_ns) * 1e-9);
                  walls.push_back(wall);
                }
                if (i == reps && !r.tensors.empty()) // kept for the mse only
                  last = r.tensors.front().tensor;
                if (std::getenv("STARLING_BENCH_TRACE"))
                  fmt::print(stderr, "rank {} round {}: rss {:.1f} MiB, peak {:.1f} MiB over base\n",
                             rank, i, (current_rss_bytes() - base) / 1048576.0,
                             (runtime::peak_rss_bytes() - base) / 1048576.0);
              },
              [&](caf::error& e) {
                ++bad;
                fmt::print(stderr, "rank {}: {}\n", rank, node.system().render(e));
              });
    }
  }
  auto rss = runtime::peak_rss_bytes();
  auto mse = mse_to_mean(last, n, numel);
  fmt::print("RESULT {} {:.6f} {:.6f} {} {} {:.3e} {}\n", rank, median(rounds), median(walls), rss,
             bad, mse, base);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1)); // let the others finish their rounds
  node.shutdown();
  return 0;
}

struct row {
  double time = 0, wall = 0, mse = 0;
  uint64_t rss = 0;
  /// Largest growth of a process's peak RSS over its RSS before the vector was made.
  uint64_t extra = 0;
  int bad = 0;
  bool ok = false;
};

row run_children(const std::string& kind, int n, int64_t numel, int reps,
                 const std::string& netns) {
  char tmpl[] = "/tmp/starling-allreduce-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<FILE*> pipes;
  for (int r = 0; r < n; ++r) {
    auto where = netns.empty()
                     ? std::string{}
                     : fmt::format("ip netns exec {}{} env STARLING_BENCH_HOST=10.77.0.{} ", netns,
                                   r, r + 1);
    auto cmd = fmt::format("{}timeout 600 /proc/{}/exe --child {} {} {} {} {} {}", where, getpid(),
                           kind, r, n, numel, dir, reps);
    pipes.push_back(popen(cmd.c_str(), "r"));
  }
  row out;
  int got = 0;
  for (auto* p : pipes) {
    char line[512];
    while (p && fgets(line, sizeof line, p)) {
      int rank = 0, bad = 0;
      double t = 0, w = 0, mse = 0;
      unsigned long long rss = 0, base = 0;
      if (std::sscanf(line, "RESULT %d %lf %lf %llu %d %lf %llu", &rank, &t, &w, &rss, &bad, &mse,
                      &base) == 7) {
        out.extra = std::max<uint64_t>(out.extra, rss > base ? rss - base : 0);
        out.mse = std::max(out.mse, mse);
        out.time = std::max(out.time, t);
        out.wall = std::max(out.wall, w);
        out.rss = std::max<uint64_t>(out.rss, rss);
        out.bad += bad;
        ++got;
      }
    }
    if (p)
      pclose(p);
  }
  out.ok = got == n;
  std::system(fmt::format("rm -rf {}", dir).c_str());
  return out;
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 8 && std::string(argv[1]) == "--child") {
    std::string kind = argv[2];
    int rank = std::atoi(argv[3]), n = std::atoi(argv[4]);
    int64_t numel = std::atoll(argv[5]);
    std::string dir = argv[6];
    int reps = std::atoi(argv[7]);
    torch::set_num_threads(1);
    if (kind == "gloo")
      return child_gloo(rank, n, numel, dir, reps);
    if (kind == "starling")
      return child_starling(rank, n, numel, dir, reps, kernels::codec_id::none);
    if (kind == "starling-fp16")
      return child_starling(rank, n, numel, dir, reps, kernels::codec_id::fp16);
    if (kind == "starling-bw8")
      return child_starling(rank, n, numel, dir, reps, kernels::codec_id::blockwise8);
    return 2;
  }
  std::vector<int> ns{2, 4};
  std::vector<std::string> kinds{"starling", "starling-fp16", "starling-bw8"};
  std::string netns;
  std::vector<std::string> positional;
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size()) {
      auto comma = s.find(',', at);
      auto end = comma == std::string::npos ? s.size() : comma;
      if (end > at)
        out.push_back(s.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--n" && has_value) {
      ns.clear();
      for (auto& v : split(argv[++i]))
        ns.push_back(std::atoi(v.c_str()));
    } else if (a == "--kinds" && has_value) {
      kinds = split(argv[++i]);
    } else if (a == "--netns" && has_value) {
      netns = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      fmt::print(stderr, "bench_allreduce: unknown option {} (see the header of allreduce.cpp)\n",
                 a);
      return 2;
    } else {
      positional.push_back(a);
    }
  }
  for (auto n : ns)
    if (n < 2 || n > 16) {
      fmt::print(stderr, "bench_allreduce: N must be 2..16\n");
      return 2;
    }
  for (auto& k : kinds)
    if (k != "starling" && k != "starling-fp16" && k != "starling-bw8") {
      fmt::print(stderr, "bench_allreduce: unknown kind {}\n", k);
      return 2;
    }
  int reps = positional.empty() ? 3 : std::max(1, std::atoi(positional[0].c_str()));
  std::vector<int64_t> sizes;
  for (size_t i = 1; i < positional.size(); ++i)
    sizes.push_back(std::atoll(positional[i].c_str()));
  if (sizes.empty())
    sizes = {int64_t{1} << 20, int64_t{16} << 20};
  fmt::print("all-reduce {}, median of {} rounds; time = slowest process; rss = largest "
             "peak RSS; extra = largest peak RSS growth over the process's RSS before the "
             "vector existed (LibTorch, CAF and Gloo themselves excluded), x_vec = extra / vector "
             "bytes; mse = error against the exact mean\n",
             netns.empty() ? "over loopback" : "across network namespaces " + netns + "*", reps);
  fmt::print("{:>2} {:>10} {:>14} {:>10} {:>10} {:>9} {:>9} {:>6} {:>8} {:>9} {:>6}\n", "N",
             "floats", "method", "time_s", "wall_s", "rss_MiB", "extra_MiB", "x_vec", "x_gloo",
             "mse", "ok");
  for (int n : ns)
    for (auto numel : sizes) {
      auto g = run_children("gloo", n, numel, reps, netns);
      auto vec = static_cast<double>(numel) * 4;
      fmt::print("{:>2} {:>10} {:>14} {:>10.4f} {:>10} {:>9.1f} {:>9.1f} {:>6.2f} {:>8} {:>9.2e} "
                 "{:>6}\n",
                 n, numel, "gloo", g.time, "-", g.rss / 1048576.0, g.extra / 1048576.0,
                 g.extra / vec, "1.00", g.mse, g.ok ? "yes" : "NO");
      std::fflush(stdout);
      for (auto& kind : kinds) {
        auto s = run_children(kind, n, numel, reps, netns);
        fmt::print("{:>2} {:>10} {:>14} {:>10.4f} {:>10.4f} {:>9.1f} {:>9.1f} {:>6.2f} {:>8.2f} "
                   "{:>9.2e} {:>6}\n",
                   n, numel, kind, s.time, s.wall, s.rss / 1048576.0, s.extra / 1048576.0,
                   s.extra / vec, g.time > 0 ? s.time / g.time : 0.0, s.mse,
                   s.ok && s.bad == 0 ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  return 0;
}
