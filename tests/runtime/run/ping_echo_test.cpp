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
#include "runtime/run/kinds.hpp"
#include "tests/support/node_fixtures.hpp"

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
using starling::messages::blob_msg;

namespace {

/// Pings the echo at `address` from `from`: the pong's bytes, or the error's rendering.
std::pair<std::vector<char>, std::string> ping(node& from, const std::string& address) {
  caf::scoped_actor self{from.system()};
  caf::actor echo;
  self->request(from.resolver(), 5s, resolve_atom::value, address)
      .receive([&](const caf::actor& x) { echo = x; },
               [&](caf::error& e) { FAIL("resolve failed: " << from.system().render(e)); });
  REQUIRE(echo);
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
  auto a = testing::start_node("a", "pings");
  auto same = testing::start_node("b", "pings");
  auto other = testing::start_node("c", "other");
  a->register_actor("echo", a->system().spawn(ping_echo));
  auto address = fmt::format("127.0.0.1:{}/echo", a->port());
  auto [bytes, why] = ping(*same, address);
  CHECK(why.empty());
  CHECK(bytes == std::vector<char>{'a', 'b', 'c'});
  auto [none, refused] = ping(*other, address);
  CHECK(none.empty());
  CHECK(refused.find("ping refused") != std::string::npos);
  CHECK(refused.find("experiment 'other', this node runs 'pings'") != std::string::npos);
  CHECK(a->wire()->refused(messages::wire_reason::experiment) == 1);
}
