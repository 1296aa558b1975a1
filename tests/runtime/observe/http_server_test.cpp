// The HTTP endpoint (runtime/observe/http_server.hpp) over real sockets on 127.0.0.1: the three
// pages, clean 4xx answers to hostile requests, and /status answering within 1 s while 50 slow
// clients trickle one byte per second into the server's two workers. Waits are polls with
// deadlines, never sleeps.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/http_server.hpp"
#include "runtime/observe/snapshot.hpp"
#include "support/http_client.hpp"

namespace starling::test::runtime_observe_http_server_test {

using namespace starling::runtime::observe;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

using testing::http_get;
using testing::http_talk;
using testing::open_loopback;

std::optional<testing::http_reply> get(uint16_t port, const std::string& path,
                                       std::chrono::milliseconds limit = 5s) {
  return http_get(port, path, limit);
}

std::optional<testing::http_reply> talk(uint16_t port, const std::string& request) {
  return http_talk(port, request);
}

std::shared_ptr<snapshot_store> filled_store() {
  run_description r;
  r.experiment = "served";
  r.kind = "ping";
  r.mode = "local";
  r.nodes = 2;
  r.members = {{"pingers.0", "pingers", 0, 0, -1}};
  snapshot_builder b{r};
  std::string src = "pingers.0", kind = "microbatch";
  b.add({1, 0, src, kind, {{"samples", 4}, {"loss", 1.5}}, {}});
  auto store = std::make_shared<snapshot_store>();
  store->publish(b.make());
  return store;
}

TEST_CASE("the endpoint serves the page, /status and /metrics from one snapshot") {
  auto srv = http_server::start(filled_store(), http_options{});
  REQUIRE_MESSAGE(srv.ok(), (srv.ok() ? "" : srv.error().what));
  auto port = (*srv)->port();
  CHECK(port > 0);
  CHECK((*srv)->url() == "http://127.0.0.1:" + std::to_string(port) + "/");
  auto metrics = get(port, "/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->head.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  auto parsed = parse_exposition(metrics->body);
  REQUIRE_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().what));
  auto status = get(port, "/status");
  REQUIRE(status);
  CHECK(status->status == 200);
  auto j = nlohmann::json::parse(status->body);
  CHECK(j["version"].get<double>() == find_sample(*parsed, "starling_snapshot_version"));
  CHECK(j["metrics"]["starling_samples_total"].get<double>() == 4);
  CHECK(j["run"]["experiment"] == "served");
  auto page = get(port, "/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->head.find("text/html") != std::string::npos);
  CHECK(page->body.find("fetch(\"/status\"") != std::string::npos);
  // Self-contained: nothing loaded from anywhere else.
  for (auto* outside : {"src=", "<link", "@import", "url(", "https://"})
    CHECK_MESSAGE(page->body.find(outside) == std::string::npos, outside);
}

TEST_CASE("hostile requests get clean 4xx answers and the server keeps answering") {
  auto srv = http_server::start(filled_store(), http_options{});
  REQUIRE(srv.ok());
  auto port = (*srv)->port();
  for (auto* path : {"/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/nope", "/status/../x",
                     "/metrics?x=<script>"}) {
    auto r = get(port, path);
    REQUIRE_MESSAGE(r, path);
    if (std::string{path}.rfind("/metrics?", 0) == 0) {
      CHECK(r->status == 200); // a query string is ignored, and never echoed
      CHECK(r->body.find("<script>") == std::string::npos);
    } else {
      CHECK_MESSAGE((r->status >= 400 && r->status < 500), path);
      CHECK(r->body.find("root:") == std::string::npos);
    }
  }
  auto post = talk(port, "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  REQUIRE(post);
  CHECK((post->status >= 400 && post->status < 500));
  auto garbage = talk(port, "\x01\x02 nonsense\r\n\r\n");
  REQUIRE(garbage);
  CHECK(garbage->status == 400);
  // A 1 MB header: refused at httplib's 8 KB line limit, answered before the rest is read.
  auto huge =
      talk(port, "GET /status HTTP/1.1\r\nX-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n");
  REQUIRE(huge);
  CHECK((huge->status >= 400 && huge->status < 500));
  // A body beyond the payload limit.
  auto big_body = talk(port, "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" +
                                 std::string(100000, 'b'));
  REQUIRE(big_body);
  CHECK((big_body->status >= 400 && big_body->status < 500));
  auto after = get(port, "/status");
  REQUIRE(after);
  CHECK(after->status == 200);
}

TEST_CASE("bad endpoints fail with a reason, not a crash") {
  auto store = filled_store();
  http_options o;
  o.threads = 3;
  CHECK_FALSE(http_server::start(store, o).ok());
  o.threads = 2;
  o.host = "203.0.113.9"; // not an address of this machine
  auto r = http_server::start(store, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().what.find("cannot bind") != std::string::npos);
  auto first = http_server::start(store, http_options{});
  REQUIRE(first.ok());
  o.host = "127.0.0.1";
  o.port = (*first)->port();
  CHECK_FALSE(http_server::start(store, o).ok()); // in use
  (*first)->stop();
  (*first)->stop();
}

/// 50 clients that each send one byte per second (and reconnect when dropped), on one thread.
class slow_clients {
public:
  slow_clients(uint16_t port, size_t n) : port_(port), n_(n) {
    thread_ = std::thread([this] { loop(); });
  }
  ~slow_clients() {
    stop_ = true;
    thread_.join();
  }
  /// Waits (bounded) until `bytes` were sent in all.
  bool wait_for_bytes(size_t bytes, steady::duration limit) {
    std::unique_lock<std::mutex> lk{mtx_};
    return cv_.wait_for(lk, limit, [&] { return sent_ >= bytes; });
  }
  size_t connections() const { return connections_; }

private:
  void loop() {
    static const std::string trickle = "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    struct client {
      int fd = -1;
      size_t at = 0;
      steady::time_point next;
    };
    std::vector<client> cs(n_);
    auto t0 = steady::now();
    for (size_t i = 0; i < n_; ++i)
      cs[i].next = t0 + std::chrono::milliseconds(20 * i); // spread over the first second
    while (!stop_) {
      auto now = steady::now();
      auto next = now + 50ms;
      for (auto& c : cs) {
        if (c.next <= now) {
          if (c.fd < 0) {
            c.fd = open_loopback(port_);
            c.at = 0;
            connections_++;
          }
          char b = trickle[c.at++ % trickle.size()];
          if (::send(c.fd, &b, 1, MSG_NOSIGNAL) == 1) {
            std::lock_guard<std::mutex> lk{mtx_};
            sent_++;
            cv_.notify_all();
          }
          c.next = now + 1s;
        }
        next = std::min(next, c.next);
      }
      std::vector<pollfd> ps;
      for (auto& c : cs)
        if (c.fd >= 0)
          ps.push_back({c.fd, POLLIN, 0});
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - steady::now());
      ::poll(ps.data(), ps.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
      for (auto& p : ps) {
        if (p.revents == 0)
          continue;
        char buf[4096];
        auto n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0 || (p.revents & (POLLERR | POLLHUP))) {
          // Dropped by the server: reconnect at once, as an attacker would.
          for (auto& c : cs)
            if (c.fd == p.fd) {
              ::close(c.fd);
              c.fd = -1;
              c.next = steady::now();
            }
        }
      }
    }
    for (auto& c : cs)
      if (c.fd >= 0)
        ::close(c.fd);
  }

  uint16_t port_;
  size_t n_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> connections_{0};
  std::mutex mtx_;
  std::condition_variable cv_;
  size_t sent_ = 0;
  std::thread thread_;
};

TEST_CASE("50 clients sending a byte a second leave /status answering within 1 s (2 workers)") {
  http_options o;
  o.threads = 2;
  auto srv = http_server::start(filled_store(), o);
  REQUIRE(srv.ok());
  auto port = (*srv)->port();
  slow_clients attack{port, 50};
  // Two rounds of trickling: every client holds (or has held) a connection.
  REQUIRE(attack.wait_for_bytes(100, 10s));
  double worst = 0;
  double total = 0;
  int answered = 0;
  for (int i = 0; i < 10; ++i) {
    auto t = steady::now();
    auto r = get(port, "/status", 3s);
    auto s = std::chrono::duration<double>(steady::now() - t).count();
    worst = std::max(worst, s);
    total += s;
    if (r && r->status == 200)
      answered++;
  }
  MESSAGE("under 50 slow clients: /status answered "
          << answered << "/10, worst " << worst * 1000 << " ms, mean " << total * 100
          << " ms; the clients made " << attack.connections() << " connections");
  CHECK(answered == 10);
  CHECK(worst < 1.0);
}

} // namespace starling::test::runtime_observe_http_server_test
