// What watching a run costs, side by side in one run. Part 1: the main job (`make run`'s
// configs/swarm-tiny.yaml, shortened with --set unless --full) runs twice as its own process,
// once plain and once with `--http 127.0.0.1:0` and a client scraping `/metrics` and `/status`
// once a second, in alternating order over --pairs pairs: samples/s from each run's summary and
// the process's CPU seconds (user + system, from wait4). Part 2: the watched run's
// metrics.jsonl replayed into a snapshot builder, timing (thread CPU) what each piece costs: one
// event folded in, one snapshot made, `/metrics` and `/status` rendered. Part 3: the wall time
// of one GET of each over loopback against the watched run (an upper bound of its CPU).
//
// Usage: bench_watch [--pairs N] [--full]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/snapshot.hpp"
#include "runtime/observe/status.hpp"

using namespace starling::runtime;
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

namespace {

/// A child process with its stdout and stderr on a pipe.
struct child {
  pid_t pid = -1;
  int out = -1;
  std::string seen;
  std::string partial;

  explicit child(const std::vector<std::string>& argv) {
    int fds[2];
    if (::pipe(fds) != 0)
      throw std::runtime_error("pipe failed");
    pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      std::vector<char*> args;
      for (auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out = fds[0];
  }

  /// The next whole line; nothing at the end of the output.
  std::optional<std::string> line() {
    for (;;) {
      if (auto nl = partial.find('\n'); nl != std::string::npos) {
        auto l = partial.substr(0, nl);
        partial.erase(0, nl + 1);
        return l;
      }
      char buf[4096];
      auto n = ::read(out, buf, sizeof buf);
      if (n <= 0)
        return std::nullopt;
      seen.append(buf, static_cast<size_t>(n));
      partial.append(buf, static_cast<size_t>(n));
    }
  }

  /// Waits for the exit; the CPU seconds the process used (user + system).
  double wait_cpu() {
    while (line()) {
    }
    int status = 0;
    struct rusage ru {};
    ::wait4(pid, &status, 0, &ru);
    ::close(out);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
           + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  }
};

/// `GET path` on 127.0.0.1:`port`; the body's size, or nothing on failure.
std::optional<size_t> http_get(uint16_t port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return std::nullopt;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  auto req = fmt::format("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string got;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0)
    got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  auto body = got.find("\r\n\r\n");
  if (got.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos)
    return std::nullopt;
  return got.size() - body - 4;
}

/// One run of the main job.
struct job_result {
  double samples_per_s = 0;
  double cpu_s = 0;
  int scrapes = 0;
  std::vector<double> metrics_ms, status_ms;
  size_t metrics_bytes = 0, status_bytes = 0;
};

job_result run_job(const std::string& out, bool watched, bool full) {
  std::vector<std::string> argv{STARLING_BINARY, "run",
                                std::string{STARLING_SOURCE_DIR} + "/configs/swarm-tiny.yaml",
                                "--out", out};
  if (!full)
    for (auto* s : {"swarm.microbatches_per_trainer=150", "swarm.eval_batches=2"})
      argv.insert(argv.end(), {"--set", s});
  if (watched)
    argv.insert(argv.end(), {"--http", "127.0.0.1:0"});
  child c{argv};
  job_result r;
  std::atomic<bool> stop{false};
  std::thread scraper;
  static const std::regex url{R"(http://127\.0\.0\.1:([0-9]+)/)"};
  static const std::regex rate{R"(run time\s+[0-9.]+ s, ([0-9.]+) samples/s)"};
  while (auto l = c.line()) {
    std::smatch m;
    if (watched && !scraper.joinable() && std::regex_search(*l, m, url)) {
      auto port = static_cast<uint16_t>(std::stoi(m[1]));
      scraper = std::thread([&r, &stop, port] {
        auto next = clk::now();
        while (!stop) {
          auto t0 = clk::now();
          auto mb = http_get(port, "/metrics");
          auto t1 = clk::now();
          auto sb = http_get(port, "/status");
          auto t2 = clk::now();
          if (mb && sb) {
            r.metrics_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
            r.status_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
            r.metrics_bytes = *mb;
            r.status_bytes = *sb;
            ++r.scrapes;
          }
          next += std::chrono::seconds(1);
          while (!stop && clk::now() < next)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    if (std::regex_search(*l, m, rate))
      r.samples_per_s = std::stod(m[1]);
  }
  stop = true;
  if (scraper.joinable())
    scraper.join();
  r.cpu_s = c.wait_cpu();
  return r;
}

double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  int pairs = 1;
  bool full = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pairs" && i + 1 < argc)
      pairs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--full")
      full = true;
    else {
      fmt::print(stderr, "usage: bench_watch [--pairs N] [--full]\n");
      return 2;
    }
  }
  auto dir = fs::temp_directory_path() / fmt::format("bench-watch-{}", ::getpid());
  fs::create_directories(dir);
  fmt::print("bench_watch: the main job (configs/swarm-tiny.yaml{}), plain and watched "
             "(--http, /metrics + /status scraped at 1 Hz), {} pair(s), alternating order\n",
             full ? "" : ", 150 microbatches per trainer", pairs);
  std::vector<job_result> plain, watched;
  std::string replay;
  for (int p = 0; p < pairs; ++p) {
    for (int k = 0; k < 2; ++k) {
      bool w = (p + k) % 2 == 1;
      auto out = (dir / fmt::format("run-{}-{}", p, w ? "watched" : "plain")).string();
      fmt::print("  pair {} {} ...\n", p + 1, w ? "watched" : "plain");
      std::fflush(stdout);
      auto r = run_job(out, w, full);
      (w ? watched : plain).push_back(r);
      if (w)
        replay = out + "/metrics.jsonl";
    }
  }
  fmt::print("\n| run | samples/s | process CPU s | scrapes | /metrics GET ms (median) | /status GET ms (median) |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < plain.size(); ++i) {
    fmt::print("| plain {} | {:.1f} | {:.1f} | – | – | – |\n", i + 1, plain[i].samples_per_s,
               plain[i].cpu_s);
    auto& w = watched[i];
    fmt::print("| watched {} | {:.1f} | {:.1f} | {} | {:.2f} | {:.2f} |\n", i + 1, w.samples_per_s,
               w.cpu_s, w.scrapes, median(w.metrics_ms), median(w.status_ms));
  }
  if (!watched.empty())
    fmt::print("answer sizes: /metrics {} bytes, /status {} bytes (last scrape)\n",
               watched.back().metrics_bytes, watched.back().status_bytes);

  // Part 2: the pieces, on the watched run's own metric stream.
  std::ifstream in{replay};
  std::vector<nlohmann::json> events;
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (j.is_object())
      events.push_back(std::move(j));
  }
  observe::run_description run;
  run.experiment = "swarm-tiny";
  run.kind = "swarm";
  run.mode = "local";
  observe::snapshot_builder b{run};
  double add_s = 0, make_s = 0, metrics_s = 0, status_s = 0;
  size_t makes = 0;
  for (auto& j : events) {
    std::map<std::string, double> values;
    std::map<std::string, std::string> labels;
    std::string source, kind;
    double t = 0;
    size_t node = 0;
    for (auto& [k, v] : j.items()) {
      if (k == "t" && v.is_number())
        t = v.get<double>();
      else if (k == "node" && v.is_number())
        node = v.get<size_t>();
      else if (k == "source" && v.is_string())
        source = v.get<std::string>();
      else if (k == "event" && v.is_string())
        kind = v.get<std::string>();
      else if (v.is_number())
        values[k] = v.get<double>();
      else if (v.is_string())
        labels[k] = v.get<std::string>();
    }
    auto c0 = thread_cpu_s();
    b.add({t, node, source, kind, values, labels});
    add_s += thread_cpu_s() - c0;
  }
  for (int i = 0; i < 200; ++i) {
    auto c0 = thread_cpu_s();
    auto s = b.make();
    auto c1 = thread_cpu_s();
    auto m = observe::render_metrics(s);
    auto c2 = thread_cpu_s();
    auto st = observe::render_status(s);
    auto c3 = thread_cpu_s();
    make_s += c1 - c0;
    metrics_s += c2 - c1;
    status_s += c3 - c2;
    ++makes;
  }
  fmt::print("\n| piece (thread CPU) | per call |\n|---|---|\n");
  fmt::print("| fold one metric event into the builder ({} events) | {:.2f} us |\n", events.size(),
             events.empty() ? 0.0 : 1e6 * add_s / static_cast<double>(events.size()));
  fmt::print("| make a snapshot (a copy, at most 5 a second) | {:.1f} us |\n",
             1e6 * make_s / static_cast<double>(makes));
  fmt::print("| render /metrics | {:.1f} us |\n", 1e6 * metrics_s / static_cast<double>(makes));
  fmt::print("| render /status | {:.1f} us |\n", 1e6 * status_s / static_cast<double>(makes));
  fs::remove_all(dir);
  return 0;
}
