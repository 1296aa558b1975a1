// Tensor transfers over the direct transport: tensors of every codec cross it between two actor
// systems on pooled links, malformed or hostile frames get a clear error with nothing delivered,
// and senders fall back to BASP chunks when there is no data endpoint.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <memory>
#include <netinet/in.h>
#include <optional>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <torch/torch.h>

#include "actors/transfer/data_channel.hpp"
#include "actors/transfer/link_frame.hpp"
#include "kernels/compress/codec.hpp"
#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/registry.hpp"
#include "messages/tensor_msg.hpp"
#include "support/raw_socket.hpp"

namespace starling::test::actors_data_channel_test {

using namespace starling;
using namespace starling::actors::transfer;
using kernels::codec_id;
using messages::direct_announce;
using messages::direct_endpoint;
using messages::tensor_msg;
using messages::transfer_report;
using namespace std::chrono_literals;

namespace {

// Two actor systems in one process (distinct nodes, BASP over loopback); node b has a data
// endpoint, a sink (a scoped actor) and a receiver published for node a.
struct fixture {
  caf::actor_system_config cfg_a;
  caf::actor_system_config cfg_b;
  std::unique_ptr<caf::actor_system> a;
  std::unique_ptr<caf::actor_system> b;
  std::shared_ptr<data_endpoint> endpoint;
  std::unique_ptr<caf::scoped_actor> sink;
  caf::actor receiver;
  uint16_t port = 0;
  caf::actor remote; // the receiver as seen from node a
  caf::actor sender;

  // `io_timeout`: how long the endpoint waits on a stalled link. Long by default, so that a test
  // thread descheduled under a loaded machine is not mistaken for a stalled sender (a 2 s
  // timeout once closed a link on its preamble before the frame a test meant to refuse).
  explicit fixture(bool with_endpoint = true, receiver_options ropts = {},
                   std::chrono::milliseconds io_timeout = 60s) {
    for (auto* cfg : {&cfg_a, &cfg_b}) {
      cfg->load<caf::io::middleman>();
      messages::register_types(*cfg);
      cfg->set("scheduler.max-threads", 2);
      cfg->set("logger.verbosity", caf::atom("quiet"));
    }
    a = std::make_unique<caf::actor_system>(cfg_a);
    b = std::make_unique<caf::actor_system>(cfg_b);
    if (with_endpoint) {
      data_channel_options o;
      o.io_timeout = io_timeout;
      auto ep = data_endpoint::open(o);
      REQUIRE_MESSAGE(ep, ep.error().what);
      endpoint = *ep;
    }
    sink = std::make_unique<caf::scoped_actor>(*b);
    receiver = spawn_direct_receiver(*b, caf::actor_cast<caf::actor>(*sink), endpoint, ropts);
    publish(receiver);
    sender = spawn_direct_sender(*a);
  }

  // Publishes `h` on node b and resolves it on node a as `remote`.
  void publish(const caf::actor& h) {
    auto p = b->middleman().publish(h, 0, "127.0.0.1");
    REQUIRE_MESSAGE(p, b->render(p.error()));
    port = *p;
    auto r = a->middleman().remote_actor("127.0.0.1", port);
    REQUIRE_MESSAGE(r, a->render(r.error()));
    remote = *r;
  }

  ~fixture() {
    caf::anon_send_exit(sender, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
    if (endpoint)
      endpoint->stop();
    b->middleman().unpublish(receiver, port);
    sink.reset();
  }

  // Sends `x` through the sender to `to` (default: the published receiver).
  caf::expected<transfer_report> send(const tensor_msg& x, caf::actor to = {}) {
    caf::scoped_actor self{*a};
    caf::expected<transfer_report> out = caf::make_error(caf::sec::invalid_argument);
    self->request(sender, 60s, transfer_atom::value, x, to ? to : remote)
      .receive([&](transfer_report& r) { out = std::move(r); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  // The next tensor the sink got, if one arrives within `wait` (0: only one already there).
  std::optional<tensor_msg> delivered(caf::timespan wait = caf::timespan{0}) {
    std::optional<tensor_msg> got;
    (*sink)->receive([&](tensor_msg& y) { got = std::move(y); }, caf::after(wait) >> [] {});
    return got;
  }

  // Announces a transfer of `total` bytes (header of `x`) from node a; returns the endpoint or
  // the receiver's error.
  caf::expected<direct_endpoint> announce(const std::vector<char>& token, uint64_t total,
                                          const tensor_msg& x) {
    auto h = kernels::make_header(x.tensor, x.codec, x.params);
    REQUIRE(h.ok());
    direct_announce ann;
    ann.token = token;
    ann.total_bytes = total;
    ann.dtype = static_cast<uint8_t>(h->dtype);
    ann.shape = h->shape;
    ann.codec = static_cast<uint8_t>(h->codec);
    caf::scoped_actor self{*a};
    caf::expected<direct_endpoint> out = caf::make_error(caf::sec::invalid_argument);
    self->request(remote, 10s, ann).receive([&](direct_endpoint& ep) { out = ep; },
                                            [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

// A hand-written client of the data endpoint's transport, for the hostile cases: it opens a link
// with an announced token, sends transfer frames and reads the status frames that come back.
struct raw_client : starling::testing::raw_socket {
  using raw_socket::raw_socket;

  static link_token tok(const std::vector<char>& t) {
    link_token out;
    std::memcpy(out.data(), t.data(), out.size());
    return out;
  }

  void open(const std::vector<char>& token) {
    uint8_t pre[link_preamble_bytes];
    write_link_preamble(tok(token), pre);
    write(pre, sizeof pre);
  }

  // A transfer frame's header and meta (the token); the payload follows separately.
  void header(const std::vector<char>& token, uint64_t length) {
    auto meta = make_link_meta(transfer_channel, std::vector<uint8_t>(token.begin(), token.end()));
    uint8_t raw[link_frame_header_bytes];
    write_link_frame_header({static_cast<uint32_t>(meta.size()), length}, raw);
    write(raw, sizeof raw);
    write(meta.data(), meta.size());
  }

  // The next transfer status ("" = delivered); "<no status>" when the link ended first.
  std::string status() {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t raw[link_frame_header_bytes];
    if (::recv(fd, raw, sizeof raw, MSG_WAITALL) != static_cast<ssize_t>(sizeof raw))
      return "<no status>";
    auto h = parse_link_frame_header(raw, sizeof raw);
    if (!h || h->payload_bytes != 0)
      return "<bad frame>";
    std::vector<uint8_t> meta(h->meta_bytes);
    if (::recv(fd, meta.data(), meta.size(), MSG_WAITALL) != static_cast<ssize_t>(meta.size()))
      return "<no status>";
    if (read_le(meta.data(), 4) != transfer_status_channel)
      return "<other channel>";
    auto st = decode_transfer_status(meta.data() + 4, meta.size() - 4);
    return st ? st->second : "<bad status>";
  }
};

std::vector<char> make_token(char seed) {
  std::vector<char> t(16);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<char>(seed + i);
  return t;
}

double mse(const at::Tensor& x, const at::Tensor& y) {
  return (x.to(torch::kDouble) - y.to(torch::kDouble)).pow(2).mean().item<double>();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a tensor of each codec crosses the direct channel and arrives within its bound") {
  fixture f;
  torch::manual_seed(31);
  auto x = torch::randn({64, 1024});
  for (auto c : {codec_id::none, codec_id::fp16, codec_id::bf16, codec_id::uniform8,
                 codec_id::blockwise8, codec_id::quantile8, codec_id::topk, codec_id::randk}) {
    CAPTURE(kernels::to_string(c));
    tensor_msg m;
    m.tensor = x;
    m.codec = c;
    m.params.seed = 7;
    auto r = f.send(m);
    REQUIRE_MESSAGE(r, caf::to_string(r.error()));
    CHECK(r->path == "direct");
    auto got = f.delivered(30s);
    REQUIRE(got);
    REQUIRE_MESSAGE(got->ok(), got->error);
    CHECK(got->tensor.sizes() == x.sizes());
    CHECK((got->tensor.scalar_type() == torch::kFloat32));
    // The same encoding decoded locally: the channel adds no error of its own.
    std::vector<char> bytes;
    REQUIRE(messages::save_tensor(m, bytes).ok());
    tensor_msg local;
    REQUIRE(messages::load_tensor(bytes, local).ok());
    CHECK(torch::equal(got->tensor, local.tensor));
    if (c == codec_id::none)
      CHECK(torch::equal(got->tensor, x));
    if (c == codec_id::fp16)
      CHECK(mse(got->tensor, x) < 5e-8);
    if (c == codec_id::uniform8 || c == codec_id::blockwise8 || c == codec_id::quantile8)
      CHECK(mse(got->tensor, x) < 8e-4);
  }
  CHECK(f.endpoint->delivered() == 8);
  CHECK(f.endpoint->failed() == 0);
}

TEST_CASE("tensors that cannot be referenced in place still cross the direct channel intact") {
  fixture f;
  torch::manual_seed(32);
  // An odd element count (not whole words), a non-contiguous view, float64, and repeated sends
  // of one size (the receive buffers are reused).
  std::vector<at::Tensor> xs{torch::randn({1001}), torch::randn({300, 200}).t(),
                             torch::randn({50, 70}, torch::kFloat64), torch::randn({4096}),
                             torch::randn({4096}), torch::randn({4096})};
  for (auto& x : xs) {
    tensor_msg m;
    m.tensor = x;
    auto r = f.send(m);
    REQUIRE_MESSAGE(r, caf::to_string(r.error()));
    CHECK(r->path == "direct");
    auto got = f.delivered(30s);
    REQUIRE(got);
    REQUIRE_MESSAGE(got->ok(), got->error);
    CHECK(torch::equal(got->tensor.to(torch::kFloat32), x.to(torch::kFloat32).contiguous()));
  }
}

TEST_CASE("a wrong token is refused with a clear error and nothing is delivered") {
  fixture f;
  tensor_msg m;
  m.tensor = torch::ones({256});
  std::vector<char> bytes;
  REQUIRE(messages::save_tensor(m, bytes).ok());
  auto ep = f.announce(make_token(1), bytes.size(), m);
  REQUIRE_MESSAGE(ep, caf::to_string(ep.error()));
  {
    raw_client c{ep->port}; // a link token nobody announced
    c.open(make_token(9));
    CHECK(c.closed_by_peer());
  }
  raw_client c{ep->port};
  c.open(make_token(1)); // the announced token opens the link once
  c.header(make_token(2), bytes.size());
  c.write(bytes.data(), bytes.size());
  CHECK(contains(c.status(), "unknown or expired token"));
  CHECK_FALSE(f.delivered());
  // The link stays open and the announced transfer is still good once; a second use is refused.
  c.header(make_token(1), bytes.size());
  c.write(bytes.data(), bytes.size());
  CHECK(c.status().empty());
  CHECK(f.delivered(30s));
  c.header(make_token(1), bytes.size());
  c.write(bytes.data(), bytes.size());
  CHECK(contains(c.status(), "unknown or expired token"));
  CHECK_FALSE(f.delivered());
}

TEST_CASE("an oversize or mismatching declared length is refused and nothing is delivered") {
  receiver_options r;
  r.max_bytes = 4096;
  fixture f{true, r};
  tensor_msg m;
  m.tensor = torch::ones({256});
  std::vector<char> bytes;
  REQUIRE(messages::save_tensor(m, bytes).ok());
  SUBCASE("an announcement above the receiver's limit") {
    auto ep = f.announce(make_token(3), 1 << 20, m);
    REQUIRE_FALSE(ep);
    CHECK(contains(caf::to_string(ep.error()), "refused"));
  }
  SUBCASE("a frame longer than its announcement") {
    auto ep = f.announce(make_token(4), bytes.size(), m);
    REQUIRE(ep);
    raw_client c{ep->port};
    c.open(make_token(4));
    c.header(make_token(4), bytes.size() + 8);
    c.write(bytes.data(), bytes.size());
    CHECK(contains(c.status(), "the frame declares"));
  }
  SUBCASE("a frame above the protocol's limit closes the link") {
    auto ep = f.announce(make_token(5), bytes.size(), m);
    REQUIRE(ep);
    raw_client c{ep->port};
    c.open(make_token(5));
    c.header(make_token(5), uint64_t{1} << 40);
    CHECK(c.status() == "<no status>");
    CHECK_MESSAGE(contains(f.endpoint->last_error(), "declares"), f.endpoint->last_error());
  }
  SUBCASE("bytes that are not the announced tensor") {
    m.tensor = torch::ones({16, 16});
    REQUIRE(messages::save_tensor(m, bytes).ok());
    tensor_msg other;
    other.tensor = torch::ones({8, 32}); // same size, other shape
    std::vector<char> wrong;
    REQUIRE(messages::save_tensor(other, wrong).ok());
    REQUIRE(wrong.size() == bytes.size());
    auto ep = f.announce(make_token(6), bytes.size(), m);
    REQUIRE(ep);
    raw_client c{ep->port};
    c.open(make_token(6));
    c.header(make_token(6), wrong.size());
    c.write(wrong.data(), wrong.size());
    CHECK(contains(c.status(), "differs from the announcement"));
  }
  SUBCASE("garbage with a valid token and length") {
    auto ep = f.announce(make_token(7), bytes.size(), m);
    REQUIRE(ep);
    std::vector<char> junk(bytes.size(), '\x5a');
    raw_client c{ep->port};
    c.open(make_token(7));
    c.header(make_token(7), junk.size());
    c.write(junk.data(), junk.size());
    CHECK(contains(c.status(), "decode"));
  }
  CHECK_FALSE(f.delivered());
  CHECK(f.endpoint->delivered() == 0);
}

namespace {

// Announces a 256 KiB transfer with `token` and sends half of it on a raw link (the caller then
// closes its side or stalls); returns the link.
std::unique_ptr<raw_client> half_sent(fixture& f, const std::vector<char>& token) {
  tensor_msg m;
  m.tensor = torch::randn({1 << 16});
  std::vector<char> bytes;
  REQUIRE(messages::save_tensor(m, bytes).ok());
  auto ep = f.announce(token, bytes.size(), m);
  REQUIRE(ep);
  auto c = std::make_unique<raw_client>(ep->port);
  c->open(token);
  c->header(token, bytes.size());
  c->write(bytes.data(), bytes.size() / 2);
  return c;
}

} // namespace

TEST_CASE("a sender that disconnects mid-stream loses its link and nothing arrives") {
  fixture f;
  auto c = half_sent(f, make_token(8));
  ::shutdown(c->fd, SHUT_WR);
  CHECK(c->status() == "<no status>");
  CHECK_MESSAGE(contains(f.endpoint->last_error(), "closed the connection after"),
                f.endpoint->last_error());
  CHECK_FALSE(f.delivered());
  CHECK(f.endpoint->delivered() == 0);
}

TEST_CASE("a sender that stalls mid-stream loses its link at the io timeout, nothing arrives") {
  fixture f{true, {}, 2s}; // the test waits this long once
  auto c = half_sent(f, make_token(9));
  CHECK(c->status() == "<no status>");
  CHECK_MESSAGE(contains(f.endpoint->last_error(), "timed out"), f.endpoint->last_error());
  CHECK_FALSE(f.delivered());
  CHECK(f.endpoint->delivered() == 0);
}

TEST_CASE("a data endpoint listens on the node's IPv4 address, the sender refuses other hosts") {
  for (auto host : {"example.org", "::1", "300.1.2.3"}) {
    data_channel_options o;
    o.host = host;
    auto ep = data_endpoint::open(o);
    CHECK_FALSE(ep);
    if (!ep)
      CHECK(contains(ep.error().what, "IPv4"));
  }
  data_channel_options alias; // another loopback address than 127.0.0.1
  alias.host = "127.0.0.2";
  auto ep = data_endpoint::open(alias);
  REQUIRE_MESSAGE(ep, ep.error().what);
  CHECK((*ep)->host() == "127.0.0.2");
  (*ep)->stop();
  // A receiver that names an endpoint nobody can connect to: the sender refuses it.
  fixture f{false};
  auto liar = f.b->spawn([]() -> caf::behavior {
    return {[](direct_announce&) { return direct_endpoint{"0.0.0.0", 4000}; }};
  });
  f.publish(liar);
  tensor_msg m;
  m.tensor = torch::ones({64});
  auto r = f.send(m);
  REQUIRE_FALSE(r);
  CHECK(contains(caf::to_string(r.error()), "wildcard"));
  CHECK_FALSE(f.delivered());
  caf::anon_send_exit(liar, caf::exit_reason::user_shutdown);
}

TEST_CASE("consecutive transfers to one node share one pooled link") {
  fixture f;
  data_channel_options client;
  client.host.clear();
  auto mine = data_endpoint::open(client);
  REQUIRE(mine);
  direct_sender_options so;
  so.endpoint = *mine;
  auto tx = spawn_direct_sender(*f.a, so);
  torch::manual_seed(34);
  for (int i = 0; i < 8; ++i) {
    tensor_msg m;
    m.tensor = torch::randn({1 << 18}); // 1 MiB
    caf::scoped_actor self{*f.a};
    std::string path;
    self->request(tx, 30s, transfer_atom::value, m, f.remote)
      .receive([&](transfer_report& r) { path = r.path; },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
    CHECK(path == "direct");
    auto got = f.delivered(30s);
    REQUIRE(got);
    CHECK(torch::equal(got->tensor, m.tensor));
  }
  CHECK((*mine)->link_layer()->connections_opened() == 1);
  caf::anon_send_exit(tx, caf::exit_reason::user_shutdown);
  (*mine)->stop();
}

TEST_CASE("without a data endpoint the sender falls back to BASP chunks and says so") {
  torch::manual_seed(33);
  auto x = torch::randn({3, 1000, 1000}); // 12 MB: three 4 MiB chunks
  tensor_msg m;
  m.tensor = x;
  SUBCASE("a receiver without an endpoint") {
    fixture f{false};
    auto r = f.send(m);
    REQUIRE_MESSAGE(r, caf::to_string(r.error()));
    CHECK(r->path == "chunked");
    CHECK(contains(r->fallback_reason, "no data endpoint"));
    auto got = f.delivered(30s);
    REQUIRE(got);
    CHECK(torch::equal(got->tensor, x));
  }
  SUBCASE("a plain chunk receiver") {
    fixture f{false};
    auto plain = spawn_chunk_receiver(*f.b, caf::actor_cast<caf::actor>(*f.sink));
    f.publish(plain);
    auto r = f.send(m);
    REQUIRE_MESSAGE(r, caf::to_string(r.error()));
    CHECK(r->path == "chunked");
    CHECK(contains(r->fallback_reason, "does not take direct transfers"));
    auto got = f.delivered(30s);
    REQUIRE(got);
    CHECK(torch::equal(got->tensor, x));
    caf::anon_send_exit(plain, caf::exit_reason::user_shutdown);
  }
  SUBCASE("an endpoint nobody listens on") {
    fixture f{false};
    // A port that was just free: bound, then closed, so connecting is refused.
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
    uint16_t dead = ntohs(addr.sin_port);
    ::close(s);
    auto sink = caf::actor_cast<caf::actor>(*f.sink);
    auto gone = f.b->spawn([sink, dead](caf::event_based_actor* self) -> caf::behavior {
      caf::message_handler ann{
        [dead](direct_announce&) { return direct_endpoint{"127.0.0.1", dead}; }};
      return ann.or_else(chunk_receiver_behavior(self, sink, {}));
    });
    f.publish(gone);
    auto r = f.send(m);
    REQUIRE_MESSAGE(r, caf::to_string(r.error()));
    CHECK(r->path == "chunked");
    CHECK(contains(r->fallback_reason, "cannot connect"));
    auto got = f.delivered(30s);
    REQUIRE(got);
    CHECK(torch::equal(got->tensor, x));
    caf::anon_send_exit(gone, caf::exit_reason::user_shutdown);
  }
}

} // namespace starling::test::actors_data_channel_test
