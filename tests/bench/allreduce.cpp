// starling's averager (butterfly all-reduce, chunks over the direct transport) side by side with
// c10d::ProcessGroupGloo::allreduce in the same run: N processes on loopback, fp32 vectors.
//   gloo      ProcessGroupGloo over 127.0.0.1, FileStore rendezvous; allreduce (sum) timed.
//   starling  one runtime::node + DHT + averager per process (chunks over the node's transport);
//             `round` is the averager's `round_ns` (group message -> reply: the all-reduce
//             without matchmaking), `w/mm` the wall time of the whole request (matchmaking
//             included; groups persist across rounds while their members stay). Both start
//             each round (request) after the same barrier (a Gloo all-reduce of one float).
// Per row: round time = median over the rounds after the first (slowest process), GB/s = vector
// bytes / round time, w/mm = mean wall time of all rounds, the first matchmaking included
// (slowest process); x_gloo and x_gloo_mm = both over Gloo's median. RSS is each process's peak
// resident memory (the largest over the N processes is printed).
//
// Every round's result is checked: at 4096 sampled elements against the exact mean (made once
// before the rounds from every rank's input); "mse" is the largest sampled mean squared error
// over all rounds and processes. A round without a complete result counts as missing: such a row
// prints "missing" instead of an error and "NO" under ok; a process that printed no result at all
// leaves its row's times missing too.
//
// usage: bench_allreduce [--n 2,4] [--kinds starling,starling-fp16,starling-bw8,starling-auto]
//                        [--netns PREFIX] [reps] [sizes...]   (default 10; 1M and 16M floats)
//   --netns PREFIX  child r runs in network namespace PREFIX<r> at 10.77.0.<r+1> (set up, shaped
//                   and removed by scripts/netns-allreduce, which passes this option)
// env: STARLING_BENCH_BASP=1 (averager over BASP only), STARLING_BENCH_NO_TLS=1
//      (starling-closed without TLS on BASP; the direct links are sealed either way), STARLING_BENCH_CHUNK_KIB=N (chunk
//      size), STARLING_BENCH_TRACE=1 (each child's RSS after every round, to stderr),
//      STARLING_BENCH_COPY=1 (the averager writes its result into a second vector and leaves
//      the input as it is; by default the result goes into the input, which is refilled with
//      the same values before each round, as Gloo's is), STARLING_BENCH_NO_BARRIER=1 (starling's
//      requests start without the barrier: the processes' skew counts in its w/mm)
// starling-auto: `codec: auto` (adaptive_codec), the codec each round is printed with
//   STARLING_BENCH_TRACE=1.
// starling-closed: `starling` in a closed run: an authority made for the row, each process with
//   its key and token, BASP over TLS and the direct links sealed (actors/transfer/link_crypto.hpp).
// children: bench_allreduce --child gloo|starling|starling-fp16|starling-bw8|starling-auto
//           |starling-closed RANK N NUMEL DIR REPS
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

#include "actors/auth/authority.hpp"
#include "actors/averager/averager.hpp"
#include "actors/transfer/data_channel.hpp"
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

/// The exact mean at sampled elements: rank r's input is `randn(numel)` seeded with r; each is
/// made once, sampled and dropped, so only the samples stay resident.
struct mean_samples {
  torch::Tensor index;
  torch::Tensor mean;

  mean_samples(int n, int64_t numel) {
    auto k = std::min<int64_t>(numel, 4096);
    index = torch::arange(k, torch::kLong) * (numel / std::max<int64_t>(k, 1));
    mean = torch::zeros({k}, torch::kDouble);
    for (int r = 0; r < n; ++r) {
      torch::manual_seed(r);
      mean += torch::randn({numel}).index_select(0, index).to(torch::kDouble);
    }
    mean /= n;
  }

  /// Sampled mean squared error of `got` (flat, numel elements); -1 when it is missing.
  double mse(const torch::Tensor& got) const {
    if (!got.defined() || got.numel() == 0 || (index.numel() > 0 && got.numel() <= index.max().item<int64_t>()))
      return -1;
    auto g = got.reshape({-1}).index_select(0, index).to(torch::kDouble);
    return (g - mean).pow(2).mean().item<double>();
  }
};

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

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (auto x : v)
    s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

/// Rank `rank`'s input, the same values every time (seeded normal draws).
void fill_input(at::Tensor& x, int rank) {
  torch::manual_seed(rank);
  x.normal_();
}

/// The worse of two sampled errors, a missing one (-1) winning.
double worse(double a, double b) {
  return a < 0 || b < 0 ? -1 : std::max(a, b);
}

/// A Gloo process group of the `n` children over the file store `store_file`.
std::unique_ptr<::c10d::ProcessGroupGloo> gloo_group(int rank, int n, const std::string& store_file) {
  auto store = c10::make_intrusive<::c10d::FileStore>(store_file, n);
  auto opts = ::c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForHostname(bench_host()));
  opts->timeout = std::chrono::seconds(120);
  return std::make_unique<::c10d::ProcessGroupGloo>(store, rank, n, opts);
}

/// Waits until every child of `pg` got here (an all-reduce of one float).
void barrier(::c10d::ProcessGroupGloo& pg) {
  std::vector<at::Tensor> bar{torch::zeros({1})};
  pg.allreduce(bar)->wait();
}

int child_gloo(int rank, int n, int64_t numel, const std::string& dir, int reps) {
  auto group = gloo_group(rank, n, dir + "/gloo.store");
  auto& pg = *group;
  mean_samples check(n, numel);
  auto base = current_rss_bytes();
  auto x = torch::empty({numel});
  fill_input(x, rank);
  std::vector<double> times;
  double mse = 0;
  for (int i = 0; i < reps; ++i) {
    // Gloo sums in place: the same input each round, refilled rather than copied (a copy would
    // hold a second vector), as starling's rounds do.
    if (i > 0)
      fill_input(x, rank);
    std::vector<at::Tensor> ts{x};
    barrier(pg); // start together
    auto t0 = clk::now();
    pg.allreduce(ts)->wait();
    auto dt = std::chrono::duration<double>(clk::now() - t0).count();
    if (i > 0)
      times.push_back(dt);
    mse = worse(mse, check.mse(ts[0] / n));
  }
  auto rss = runtime::peak_rss_bytes();
  fmt::print("RESULT {} {:.6f} {:.6f} {} 0 {:.3e} {}\n", rank, median(times), 0.0, rss, mse,
             base);
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

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// A closed run's settings for process `rank`: its key and a token from the row's authority.
bool closed_node(runtime::node_options& no, int rank, const std::string& dir) {
  namespace auth = actors::auth;
  auto a = auth::load_authority(dir + "/authority");
  if (!a) {
    fmt::print(stderr, "authority: {}\n", a.error().what);
    return false;
  }
  no.key_file = fmt::format("{}/n{}/node.key", dir, rank);
  auto key = auth::load_or_create_key(no.key_file, auth::key_role::node);
  if (!key) {
    fmt::print(stderr, "key: {}\n", key.error().what);
    return false;
  }
  auto t = auth::issue_token(*a, {key->key.public_key(), {"any"}, unix_ns() - 1'000'000'000,
                                  int64_t{3600} * 1'000'000'000, {}});
  if (!t) {
    fmt::print(stderr, "token: {}\n", t.error().what);
    return false;
  }
  no.token = fmt::format("{}/n{}.token", dir, rank);
  if (auto st = auth::write_file_atomically(no.token, t->file_text, 0600); !st)
    return false;
  no.authority = dir + "/authority/authority.pub";
  no.tls = std::getenv("STARLING_BENCH_NO_TLS") == nullptr;
  return true;
}

int child_starling(int rank, int n, int64_t numel, const std::string& dir, int reps,
                   kernels::codec_id codec, bool adaptive = false, bool closed = false) {
  runtime::caf_options caf_opts;
  caf_opts.scheduler_policy = "sharing";
  runtime::node_options node_opts;
  node_opts.listen = bench_host() + ":0";
  if (closed && !closed_node(node_opts, rank, dir))
    return 2;
  auto nd = runtime::node::start(caf_opts, node_opts, "bench" + std::to_string(rank));
  if (!nd) {
    fmt::print(stderr, "node: {}\n", nd.error().what);
    return 2;
  }
  auto& node = **nd;
  if (closed && (!node.data_endpoint() || !node.data_endpoint()->link_layer()->sealed())) {
    fmt::print(stderr, "closed run without sealed direct links\n");
    return 2;
  }
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
  // The result is written into the request's vector (a training loop hands over a fresh
  // gradient each step); STARLING_BENCH_COPY=1: into a second vector, the input kept.
  a.in_place = std::getenv("STARLING_BENCH_COPY") == nullptr;
  a.codec = codec;
  a.adaptive_codec = adaptive;
  // Chunks over the node's direct transport (STARLING_BENCH_BASP=1: BASP only).
  if (!std::getenv("STARLING_BENCH_BASP") && node.data_endpoint())
    a.transport = node.data_endpoint()->link_layer();
  auto avg = actors::averager::spawn_averager(node.system(), dht, node.resolver(), a);
  node.register_actor("averager", avg);
  std::this_thread::sleep_for(std::chrono::milliseconds(500)); // DHT joins settle
  // Every request starts after the same barrier as Gloo's rounds, so that neither time counts
  // the processes' skew (their refills, their previous round's end); STARLING_BENCH_NO_BARRIER=1
  // leaves it out (the skew then counts in starling's time with matchmaking only, as before).
  std::unique_ptr<::c10d::ProcessGroupGloo> sync;
  if (!std::getenv("STARLING_BENCH_NO_BARRIER"))
    sync = gloo_group(rank, n, dir + "/barrier.store");
  mean_samples check(n, numel);
  auto base = current_rss_bytes();
  auto x = torch::empty({numel});
  fill_input(x, rank);
  std::vector<double> rounds, walls;
  double mse = 0;
  int bad = 0;
  {
    caf::scoped_actor self{node.system()};
    for (int i = 0; i < reps; ++i) {
      if (i > 0 && a.in_place)
        fill_input(x, rank); // the last round wrote its result into it, as Gloo's rounds do
      messages::tensor_list tl;
      tl.tensors.push_back(messages::tensor_msg{x, kernels::codec_id::none, {}, {}});
      if (sync)
        barrier(*sync);
      auto t0 = clk::now();
      self->request(avg, std::chrono::seconds(300), average_atom::value, std::string("bench"), tl,
                    1.0)
          .receive(
              [&](messages::average_result& r) {
                auto wall = std::chrono::duration<double>(clk::now() - t0).count();
                bool complete = r.report.outcome == messages::round_outcome::complete
                                && r.report.members.size() == static_cast<size_t>(n)
                                && !r.tensors.empty();
                if (!complete) {
                  ++bad;
                  mse = -1;
                  fmt::print(stderr, "rank {}: {}\n", rank,
                             actors::averager::summary(r.report));
                } else {
                  mse = worse(mse, check.mse(r.tensors.front().tensor));
                }
                // Every round counts with matchmaking (the first one's included); the first is
                // left out of the round time (warm-up, as for Gloo).
                walls.push_back(wall);
                if (i > 0)
                  rounds.push_back(static_cast<double>(r.report.round_ns) * 1e-9);
                if (std::getenv("STARLING_BENCH_TRACE"))
                  fmt::print(stderr, "rank {} round {}: {:.4f} s ({:.4f} s round), rss {:.1f} MiB, "
                             "peak {:.1f} MiB over base {}\n",
                             rank, i, wall, static_cast<double>(r.report.round_ns) * 1e-9,
                             (current_rss_bytes() - base) / 1048576.0,
                             (runtime::peak_rss_bytes() - base) / 1048576.0, r.report.detail);
              },
              [&](caf::error& e) {
                ++bad;
                mse = -1;
                fmt::print(stderr, "rank {}: {}\n", rank, node.system().render(e));
              });
    }
  }
  auto rss = runtime::peak_rss_bytes();
  fmt::print("RESULT {} {:.6f} {:.6f} {} {} {:.3e} {}\n", rank, median(rounds), mean_of(walls),
             rss, bad, mse, base);
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
  if (kind == "starling-closed") {
    actors::auth::authority_init_options o;
    o.dir = dir + "/authority";
    o.experiment = "bench-allreduce";
    o.now_ns = unix_ns() - 60'000'000'000;
    if (auto a = actors::auth::init_authority(o); !a)
      fmt::print(stderr, "authority: {}\n", a.error().what);
  }
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
        out.mse = worse(out.mse, mse);
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
    if (kind == "starling-auto")
      return child_starling(rank, n, numel, dir, reps, kernels::codec_id::none, true);
    if (kind == "starling-closed")
      return child_starling(rank, n, numel, dir, reps, kernels::codec_id::none, false, true);
    return 2;
  }
  std::vector<int> ns{2, 4};
  std::vector<std::string> kinds{"starling", "starling-fp16", "starling-bw8", "starling-auto"};
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
    if (k != "starling" && k != "starling-fp16" && k != "starling-bw8" && k != "starling-auto"
        && k != "starling-closed") {
      fmt::print(stderr, "bench_allreduce: unknown kind {}\n", k);
      return 2;
    }
  int reps = positional.empty() ? 10 : std::max(2, std::atoi(positional[0].c_str()));
  std::vector<int64_t> sizes;
  for (size_t i = 1; i < positional.size(); ++i)
    sizes.push_back(std::atoll(positional[i].c_str()));
  if (sizes.empty())
    sizes = {int64_t{1} << 20, int64_t{16} << 20};
  fmt::print("all-reduce {}, {} rounds per row (see the header of allreduce.cpp); round = median "
             "round time after the first, slowest process; GB/s = vector bytes / round; w/mm = mean "
             "wall time of all rounds with matchmaking; rss = largest peak RSS; extra = largest "
             "peak RSS growth over the process's RSS before the vector existed, x_vec = extra / "
             "vector bytes; mse = largest sampled error against the exact mean over every round\n",
             netns.empty() ? "over loopback" : "across network namespaces " + netns + "*", reps);
  fmt::print("{:>2} {:>10} {:>14} {:>9} {:>6} {:>9} {:>7} {:>9} {:>8} {:>9} {:>6} {:>9} {:>4}\n",
             "N", "floats", "method", "round_s", "GB/s", "w/mm_s", "x_gloo", "x_gloo_mm",
             "rss_MiB", "extra_MiB", "x_vec", "mse", "ok");
  auto num = [](bool have, double v, const char* f) {
    return have ? fmt::format(fmt::runtime(f), v) : std::string{"missing"};
  };
  for (int n : ns)
    for (auto numel : sizes) {
      auto vec = static_cast<double>(numel) * 4;
      auto g = run_children("gloo", n, numel, reps, netns);
      bool gt = g.ok && g.time > 0;
      fmt::print("{:>2} {:>10} {:>14} {:>9} {:>6} {:>9} {:>7} {:>9} {:>8.1f} {:>9.1f} {:>6.2f} "
                 "{:>9} {:>4}\n",
                 n, numel, "gloo", num(gt, g.time, "{:.4f}"), num(gt, vec / g.time / 1e9, "{:.2f}"),
                 "-", "1.00", "-", g.rss / 1048576.0, g.extra / 1048576.0, g.extra / vec,
                 num(g.mse >= 0 && g.ok, g.mse, "{:.2e}"), g.ok && g.mse >= 0 ? "yes" : "NO");
      std::fflush(stdout);
      for (auto& kind : kinds) {
        auto s = run_children(kind, n, numel, reps, netns);
        bool st = s.ok && s.time > 0;
        fmt::print("{:>2} {:>10} {:>14} {:>9} {:>6} {:>9} {:>7} {:>9} {:>8.1f} {:>9.1f} {:>6.2f} "
                   "{:>9} {:>4}\n",
                   n, numel, kind, num(st, s.time, "{:.4f}"), num(st, vec / s.time / 1e9, "{:.2f}"),
                   num(s.ok, s.wall, "{:.4f}"), num(st && gt, s.time / g.time, "{:.2f}"),
                   num(s.ok && gt, s.wall / g.time, "{:.2f}"), s.rss / 1048576.0,
                   s.extra / 1048576.0, s.extra / vec, num(s.mse >= 0 && s.ok, s.mse, "{:.2e}"),
                   s.ok && s.bad == 0 && s.mse >= 0 ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  return 0;
}
