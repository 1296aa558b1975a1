#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <torch/torch.h>

#include "actors/transfer/chunked.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::test::actors_chunked_test {

using namespace starling;
using namespace starling::actors::transfer;
using starling::messages::tensor_msg;

namespace {

// Two actor systems in one process: distinct nodes talking BASP over loopback TCP.
struct two_nodes {
  caf::actor_system_config cfg_a;
  caf::actor_system_config cfg_b;
  std::unique_ptr<caf::actor_system> a;
  std::unique_ptr<caf::actor_system> b;

  two_nodes() {
    for (auto* cfg : {&cfg_a, &cfg_b}) {
      cfg->load<caf::io::middleman>();
      messages::register_types(*cfg);
      cfg->set("scheduler.max-threads", 2);
      cfg->set("logger.verbosity", caf::atom("quiet"));
    }
    a = std::make_unique<caf::actor_system>(cfg_a);
    b = std::make_unique<caf::actor_system>(cfg_b);
  }
};

// Sends `x` from node a through a chunk sender to a receiver published on node b; returns the
// sender's reply (payload bytes or error) and, when one arrived, the tensor b's sink got.
struct outcome {
  caf::expected<uint64_t> reply = caf::make_error(caf::sec::invalid_argument);
  std::optional<tensor_msg> delivered;
};

outcome send_between_nodes(const at::Tensor& x, chunked_options sopts, receiver_options ropts) {
  two_nodes nodes;
  outcome out;
  caf::scoped_actor sink{*nodes.b};
  auto receiver = spawn_chunk_receiver(*nodes.b, sink, ropts);
  auto port = nodes.b->middleman().publish(receiver, 0, "127.0.0.1");
  REQUIRE_MESSAGE(port, nodes.b->render(port.error()));
  auto remote = nodes.a->middleman().remote_actor("127.0.0.1", *port);
  REQUIRE_MESSAGE(remote, nodes.a->render(remote.error()));
  auto sender = spawn_chunk_sender(*nodes.a, sopts);
  caf::scoped_actor self{*nodes.a};
  tensor_msg m;
  m.tensor = x;
  self->request(sender, std::chrono::seconds(60), transfer_atom::value, m, *remote)
      .receive([&](uint64_t bytes) { out.reply = bytes; },
               [&](caf::error& e) { out.reply = std::move(e); });
  if (out.reply)
    sink->receive([&](tensor_msg& y) { out.delivered = std::move(y); },
                  caf::after(std::chrono::seconds(30)) >> [] {});
  caf::anon_send_exit(sender, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
  nodes.b->middleman().unpublish(receiver, *port);
  return out;
}

} // namespace

TEST_CASE("the chunked path delivers a 10 MB tensor intact between two actor systems") {
  torch::manual_seed(21);
  auto x = torch::randn({10, 1024, 256}); // 10 MiB of fp32: 3 chunks of at most 4 MiB
  auto out = send_between_nodes(x, {}, {});
  REQUIRE_MESSAGE(out.reply, caf::to_string(out.reply.error()));
  CHECK(*out.reply > uint64_t{10} << 20);
  REQUIRE(out.delivered);
  CHECK(out.delivered->ok());
  CHECK((out.delivered->tensor.sizes() == x.sizes()));
  CHECK(torch::equal(out.delivered->tensor, x));
}

TEST_CASE("a window of one with small chunks still delivers the tensor intact") {
  torch::manual_seed(22);
  auto x = torch::randn({300, 1000}).to(torch::kFloat64);
  chunked_options o;
  o.chunk_bytes = 100000; // 24 chunks, one in flight at a time
  o.window = 1;
  auto out = send_between_nodes(x, o, {});
  REQUIRE_MESSAGE(out.reply, caf::to_string(out.reply.error()));
  REQUIRE(out.delivered);
  CHECK((out.delivered->tensor.scalar_type() == torch::kFloat64));
  CHECK(torch::equal(out.delivered->tensor, x));
}

TEST_CASE("a receiver refuses a transfer above its limit and the sender reports it") {
  auto x = torch::ones({1 << 20});
  receiver_options r;
  r.max_bytes = 1 << 20; // the payload is 4 MiB plus the header
  auto out = send_between_nodes(x, {}, r);
  REQUIRE_FALSE(out.reply);
  CHECK(caf::to_string(out.reply.error()).find("refused") != std::string::npos);
  CHECK_FALSE(out.delivered);
}

} // namespace starling::test::actors_chunked_test
