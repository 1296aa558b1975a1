// The `ping` kind's echo across processes: a pong for a ping of the run, and for a ping whose
// envelope was refused an error naming the reason (never an empty pong that would pass for a
// round trip).
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "messages/wire_context.hpp"
#include "runtime/node/node.hpp"
#include "actors/ping/ping.hpp"
#include "runtime/node/gate.hpp"
#include "tests/support/closed_run.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::runtime_ping_echo_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
using starling::messages::blob_msg;

namespace {

/// The echo at `address`, resolved from `from`.
caf::actor resolve_echo(node& from, const std::string& address) {
  caf::scoped_actor self{from.system()};
  caf::actor echo;
  self->request(from.resolver(), 5s, resolve_atom::value, address)
      .receive([&](const caf::actor& x) { echo = x; },
               [&](caf::error& e) { FAIL("resolve failed: " << from.system().render(e)); });
  REQUIRE(echo);
  return echo;
}

/// Pings `echo` from `from`: the pong's bytes, or the error's rendering.
std::pair<std::vector<char>, std::string> ping(node& from, const caf::actor& echo) {
  caf::scoped_actor self{from.system()};
  std::pair<std::vector<char>, std::string> out;
  self->request(echo, 5s, blob_msg{"ping", {'a', 'b', 'c'}})
      .receive(
          [&](const blob_msg& m) {
            CHECK(m.wire_error.empty());
            CHECK(m.tag == "pong");
            out.first = m.bytes;
          },
          [&](caf::error& e) { out.second = from.system().render(e); });
  return out;
}

} // namespace

TEST_CASE(
    "the ping echo answers a refused ping with the reason and a ping of its run with a pong") {
  // A closed run: c is admitted, then its token is revoked; its next ping is refused.
  testing::closed_run run;
  auto a = run.start("a", false);
  auto same = run.start("b", false);
  auto other = run.start("c", false);
  a->register_actor("echo", actors::ping::spawn_echo(a->system()));
  auto address = fmt::format("127.0.0.1:{}/echo", a->port());
  auto [bytes, why] = ping(*same, resolve_echo(*same, address));
  CHECK(why.empty());
  CHECK(bytes == std::vector<char>{'a', 'b', 'c'});
  auto echo = resolve_echo(*other, address);
  auto [before, fine] = ping(*other, echo);
  CHECK(fine.empty());
  std::string taken;
  REQUIRE(a->gate()->install_deny_list(testing::revoke(run, testing::token_id_of(run, "c")), taken));
  // The handle c resolved while admitted: its next envelope is refused on arrival.
  auto [none, refused] = ping(*other, echo);
  CHECK(none.empty());
  CHECK(refused.find("ping refused") != std::string::npos);
  CHECK(refused.find("envelope refused (unauthorized): refused (revoked)") != std::string::npos);
  CHECK(a->wire()->refused(messages::wire_reason::unauthorized) == 1);
}

} // namespace starling::test::runtime_ping_echo_test
