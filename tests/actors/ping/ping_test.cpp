// The ping actors under the testing scheduler (virtual time): a pinger resolves its target once,
// pings it every interval and reports each round trip; a target that does not resolve, or an
// echo that died, is a loss; the echo refuses a ping whose envelope was refused.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/ping/ping.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/registry.hpp"
#include "messages/types.hpp"
#include "tests/support/test_system.hpp"

namespace starling::test::actors_ping_test {

using namespace std::chrono_literals;
using starling::messages::blob_msg;
using starling::messages::metric_event;

namespace {

/// A deterministic actor system (CAF-NOTES, "Deterministic tests with doctest").
using starling::test::test_system;

/// The metrics a pinger sent, and the resolutions its resolver was asked for.
struct seen {
  std::vector<metric_event> metrics;
  std::vector<std::string> resolved;
};

/// A resolver that knows one address, and a sink that keeps what it gets.
std::pair<caf::actor, caf::actor> resolver_and_sink(caf::actor_system& sys, std::string address,
                                                    caf::actor target, std::shared_ptr<seen> out) {
  auto resolver = sys.spawn([=](caf::event_based_actor*) -> caf::behavior {
    return {[=](resolve_atom, const std::string& a) -> caf::result<caf::actor> {
      out->resolved.push_back(a);
      if (a == address)
        return target;
      return caf::make_error(caf::sec::invalid_argument, a);
    }};
  });
  auto sink = sys.spawn([=](caf::event_based_actor*) -> caf::behavior {
    return {[=](metric_event& e) { out->metrics.push_back(std::move(e)); }};
  });
  return {resolver, sink};
}

} // namespace

TEST_CASE("a pinger resolves its target once and reports a round trip every interval") {
  test_system ts;
  auto& sys = *ts.sys;
  auto echo = actors::ping::spawn_echo(sys);
  auto out = std::make_shared<seen>();
  auto [resolver, sink] = resolver_and_sink(sys, "@1/echo.1", echo, out);
  actors::ping::pinger_options o;
  o.name = "pinger.0";
  o.targets = {"@1/echo.1"};
  o.payload = 16;
  o.interval = 1s;
  o.timeout = 2s;
  o.resolver = resolver;
  o.sink = sink;
  auto pinger = actors::ping::spawn_pinger(sys, o);
  ts.run();
  CHECK(out->metrics.empty()); // the first ping goes out one interval after the start
  for (int i = 0; i < 3; ++i)
    ts.advance(1s);
  REQUIRE(out->metrics.size() == 3);
  for (auto& m : out->metrics) {
    CHECK(m.source == "pinger.0");
    CHECK(m.kind == "ping");
    CHECK(m.labels.at("target") == "@1/echo.1");
    CHECK(m.values.at("rtt_ms") == 0.0); // no time passes between the ping and its pong
  }
  CHECK(out->resolved == std::vector<std::string>{"@1/echo.1"});
  // The echo dies: the next ping is lost (with the reason) and the target is resolved again.
  caf::anon_send_exit(echo, caf::exit_reason::kill);
  ts.run();
  ts.advance(1s);
  REQUIRE(out->metrics.size() == 4);
  CHECK(out->metrics.back().kind == "lost");
  CHECK(!out->metrics.back().labels.at("reason").empty());
  CHECK(out->metrics.back().values.count("rtt_ms") == 0);
  ts.advance(1s);
  CHECK(out->resolved.size() == 2);
  for (auto& a : {pinger, resolver, sink})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  ts.run();
}

TEST_CASE("a target that does not resolve is a loss, and no target means no ping") {
  test_system ts;
  auto& sys = *ts.sys;
  auto out = std::make_shared<seen>();
  auto [resolver, sink] = resolver_and_sink(sys, "@1/echo.1", caf::actor{}, out);
  actors::ping::pinger_options o;
  o.name = "pinger.1";
  o.targets = {"@2/echo.2"};
  o.resolver = resolver;
  o.sink = sink;
  auto lost = actors::ping::spawn_pinger(sys, o);
  o.targets.clear();
  auto idle = actors::ping::spawn_pinger(sys, o);
  ts.run();
  ts.advance(1s);
  REQUIRE(out->metrics.size() == 1);
  CHECK(out->metrics[0].kind == "lost");
  CHECK(out->metrics[0].labels.at("target") == "@2/echo.2");
  CHECK(out->resolved == std::vector<std::string>{"@2/echo.2"});
  for (auto& a : {lost, idle, resolver, sink})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  ts.run();
}

TEST_CASE("the echo answers a ping with its bytes and a refused ping with the reason") {
  test_system ts;
  auto& sys = *ts.sys;
  auto echo = actors::ping::spawn_echo(sys);
  auto pong = std::make_shared<std::optional<blob_msg>>();
  auto refusal = std::make_shared<std::string>();
  auto client = sys.spawn([=, &sys](caf::event_based_actor* self) {
    self->request(echo, caf::infinite, blob_msg{"ping", {'a', 'b'}, {}})
        .then([=](blob_msg& m) { *pong = std::move(m); }, [](caf::error&) {});
    self->request(echo, caf::infinite, blob_msg{"", {}, "unauthorized"})
        .then([](blob_msg&) {}, [=, &sys](caf::error& e) { *refusal = sys.render(e); });
  });
  ts.run();
  REQUIRE(pong->has_value());
  CHECK((*pong)->tag == "pong");
  CHECK((*pong)->bytes == std::vector<char>{'a', 'b'});
  CHECK(refusal->find("ping refused: unauthorized") != std::string::npos);
  for (auto& a : {echo, client})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  ts.run();
}

} // namespace starling::test::actors_ping_test
