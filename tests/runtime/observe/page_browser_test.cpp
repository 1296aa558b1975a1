// The run's page in a real browser: headless Chromium (Debian's `chromium`, which
// `scripts/install-deps --tests` installs on the `make test` path) loads the page of a local
// dedloc run from the node alone, lists the live peers, and updates itself: two DOM dumps taken
// while the run goes on show two different global steps. A screenshot stays in the build folder
// (page-screenshot.png) for people to look at.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <unistd.h>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/http_client.hpp"
#include "support/scratch.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_observe_page_browser_test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using testing::scratch;

/// Debian's Chromium, or the one `STARLING_CHROMIUM` names.
std::string chromium() {
  if (const char* c = std::getenv("STARLING_CHROMIUM"); c && *c)
    return c;
  return "/usr/bin/chromium";
}

/// Chromium headless as root on a machine with no outside network: no sandbox (root), no GPU,
/// nothing that phones home, a fresh profile per start (two starts cannot share one).
std::vector<std::string> browser(const scratch& dir, const std::string& profile) {
  return {chromium(),
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
          "--hide-scrollbars",
          "--user-data-dir=" + (dir.path / profile).string()};
}

/// Runs the browser to its end; its stdout.
std::string run_browser(std::vector<std::string> argv) {
  testing::subprocess b{argv, false};
  while (b.read_line(60s)) {
  }
  auto code = b.wait_exit(30s);
  REQUIRE_MESSAGE(code, "chromium did not exit");
  CHECK(*code == 0);
  return b.output();
}

/// Dumps the page's DOM, up to three times while the page fails to load. The endpoint drops a
/// connection that sends no request within ~10 ms (its defence against idle connections,
/// http_server.cpp), and a loaded machine can delay Chromium's request on a connection it opened
/// ahead (a preconnect) past that: the load fails with ERR_SOCKET_NOT_CONNECTED. A person's
/// reload, like the page's own refresh, tries again; so does this.
std::string dump_dom(const scratch& dir, const std::string& profile, const std::string& url) {
  std::string dom;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto argv = browser(dir, profile + "-" + std::to_string(attempt));
    argv.insert(argv.end(), {"--virtual-time-budget=3000", "--dump-dom", url});
    dom = run_browser(argv);
    if (dom.find("id=\"tiles\"") != std::string::npos && dom.find("global step") != std::string::npos)
      return dom;
    MESSAGE("attempt " << attempt + 1 << ": the page did not load, trying again");
  }
  return dom;
}

/// The page's "global step" tile in a DOM dump; -1 when it shows none.
long step_in(const std::string& dom) {
  static const std::regex tile{R"(<div class="v">([0-9]+)</div><div class="k">global step)"};
  std::smatch m;
  if (!std::regex_search(dom, m, tile))
    return -1;
  return std::stol(m[1]);
}

/// The global step `/status` reports; -1 before the first.
long status_step(uint16_t port) {
  auto st = testing::http_get(port, "/status", 2000ms);
  if (!st || st->status != 200)
    return -1;
  auto j = nlohmann::json::parse(st->body, nullptr, false);
  if (j.is_discarded() || !j.contains("metrics"))
    return -1;
  auto& v = j["metrics"]["starling_global_step"];
  return v.is_number() ? static_cast<long>(v.get<double>()) : -1;
}

/// Polls `/status` until its global step exceeds `than` (or `limit` passes); the step seen.
long wait_step(uint16_t port, long than, std::chrono::seconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  long s = -1;
  while (std::chrono::steady_clock::now() < until) {
    s = status_step(port);
    if (s > than)
      return s;
    std::this_thread::sleep_for(250ms); // a poll with a deadline, not a guess at a time
  }
  return s;
}

TEST_CASE("headless Chromium shows the live page of a local dedloc run, and it updates") {
  REQUIRE_MESSAGE(fs::exists(chromium()),
                  chromium() << " is missing: `bash scripts/install-deps --tests` installs it "
                                "(Debian package chromium), or set STARLING_CHROMIUM");
  scratch dir{"starling-page-browser"};
  auto yaml = (dir.path / "page.yaml").string();
  std::ofstream{yaml} << "experiment: {name: page-dedloc, kind: dedloc, seed: 5, mode: local, "
                         "duration: 90s, nodes: 3}\n"
                         "caf: {scheduler: {policy: sharing, max_threads: 2}}\n"
                         "dedloc: {peers: 3, speeds: [1.0, 1.0, 1.0], clients: 0, churn: 0, "
                         "backend: torch, width: 32, layers: 1, optimizer: adam, lr: 0.002, "
                         "microbatch: 16, target_batch: 96, compute_time: 10ms, window: 500ms, "
                         "eval_every: 1000}\n";
  testing::subprocess run{{STARLING_BINARY, "run", yaml, "--out", (dir.path / "out").string(),
                           "--http", "127.0.0.1:0"}};
  auto line = run.wait_for("watch the run at", 60s);
  REQUIRE_MESSAGE(line, run.output());
  std::smatch m;
  REQUIRE(std::regex_search(*line, m, std::regex{R"(http://127\.0\.0\.1:([0-9]+)/)"}));
  auto url = m[0].str();
  auto port = static_cast<uint16_t>(std::stoi(m[1]));
  // The page is one self-contained document: nothing it loads comes from elsewhere.
  auto page = testing::http_get(port, "/", 2000ms);
  REQUIRE(page);
  CHECK(page->body.find("src=\"http") == std::string::npos);
  CHECK(page->body.find("href=\"http") == std::string::npos);
  MESSAGE("page size: " << page->body.size() << " bytes");

  REQUIRE_MESSAGE(wait_step(port, 0, 60s) > 0, run.output());
  auto t0 = std::chrono::steady_clock::now();
  auto dom1 = dump_dom(dir, "p1", url);
  auto render_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("chromium start, load and first render (dump-dom): " << render_s << " s");
  auto step1 = step_in(dom1);
  CHECK_MESSAGE(step1 > 0, dom1);
  // Every peer of the run is listed, live (a green dot before its name).
  for (auto* peer : {"peers.0", "peers.1", "peers.2"})
    CHECK_MESSAGE(dom1.find(std::string{"<span class=\"dot live\"></span>"} + peer)
                    != std::string::npos,
                  peer);
  CHECK(dom1.find("dedloc · local mode · 3 nodes") != std::string::npos);

  // The run goes on; a second look shows a later step.
  REQUIRE(wait_step(port, step1, 60s) > step1);
  auto step2 = step_in(dump_dom(dir, "p2", url));
  CHECK(step2 > step1);

  auto shot = fs::path{STARLING_BINARY}.parent_path() / "page-screenshot.png";
  fs::remove(shot);
  // Tried up to three times, as dump_dom: under load the endpoint's idle cut can drop the
  // browser's preconnected socket and the load fails (no file is written then).
  for (int attempt = 0; attempt < 3 && !fs::exists(shot); ++attempt) {
    auto third = browser(dir, "p3-" + std::to_string(attempt));
    third.insert(third.end(), {"--window-size=1280,1000", "--virtual-time-budget=3000",
                               "--screenshot=" + shot.string(), url});
    run_browser(third);
    if (!fs::exists(shot))
      MESSAGE("attempt " << attempt + 1 << ": no screenshot, trying again");
  }
  REQUIRE(fs::exists(shot));
  std::ifstream in{shot, std::ios::binary};
  char magic[8] = {};
  in.read(magic, 8);
  CHECK(std::string(magic + 1, 3) == "PNG");
  MESSAGE("screenshot: " << shot.string());
  run.signal(SIGINT);
  CHECK(run.wait_exit(60s));
}

} // namespace starling::test::runtime_observe_page_browser_test
