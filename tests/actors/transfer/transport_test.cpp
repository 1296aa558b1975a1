// The direct transport without actors: its framing (pure), frames crossing pooled links in both
// directions (also from a client-mode transport that accepts no connections), hostile input
// refused with nothing delivered, lost links reported, backpressure and buffer reuse.
#include "actors/transfer/transport.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <unistd.h>

#include <torch/torch.h>

#include "actors/transfer/link_frame.hpp"
#include "actors/transfer/socket_io.hpp"
#include "support/channel_collector.hpp"
#include "support/raw_socket.hpp"

namespace starling::test::actors_transport_test {

using namespace starling;
using namespace starling::actors::transfer;
using namespace std::chrono_literals;
using starling::testing::collector;
using starling::testing::transports;

namespace {

uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

link_token sample_token() {
  link_token t{};
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<uint8_t>(i * 17 + 3);
  return t;
}

using raw_link = starling::testing::raw_socket;

/// Writes a preamble with `token` on `c`.
void preamble(raw_link& c, const link_token& token) {
  uint8_t pre[link_preamble_bytes];
  write_link_preamble(token, pre);
  c.write(pre, sizeof pre);
}

/// Writes a frame header and `meta` on `c`.
void frame_head(raw_link& c, const std::vector<uint8_t>& meta, uint64_t payload) {
  uint8_t fh[link_frame_header_bytes];
  write_link_frame_header({static_cast<uint32_t>(meta.size()), payload}, fh);
  c.write(fh, sizeof fh);
  c.write(meta.data(), meta.size());
}

} // namespace

TEST_CASE("link framing: preamble and frame header round trip, every malformed one is refused") {
  auto t = sample_token();
  uint8_t pre[link_preamble_bytes];
  write_link_preamble(t, pre);
  auto back = parse_link_preamble(pre, sizeof pre);
  REQUIRE(back);
  CHECK(*back == t);
  CHECK_FALSE(parse_link_preamble(pre, sizeof pre - 1));
  CHECK_FALSE(parse_link_preamble(pre, 0));
  // Every single-bit flip outside the token is refused (magic, version, flags).
  for (size_t byte = 0; byte < 8; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t copy[link_preamble_bytes];
      std::memcpy(copy, pre, sizeof copy);
      copy[byte] ^= static_cast<uint8_t>(1 << bit);
      CHECK_FALSE(parse_link_preamble(copy, sizeof copy));
    }
  pre[4] = 2;
  auto version = parse_link_preamble(pre, sizeof pre);
  REQUIRE_FALSE(version);
  CHECK(version.error().what.find("version") != std::string::npos);

  uint8_t fh[link_frame_header_bytes];
  write_link_frame_header({100, 12345}, fh);
  auto h = parse_link_frame_header(fh, sizeof fh);
  REQUIRE(h);
  CHECK(h->meta_bytes == 100);
  CHECK(h->payload_bytes == 12345);
  CHECK_FALSE(parse_link_frame_header(fh, sizeof fh - 1));
  for (int bit = 0; bit < 32; ++bit) { // the magic
    uint8_t copy[link_frame_header_bytes];
    std::memcpy(copy, fh, sizeof copy);
    copy[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    CHECK_FALSE(parse_link_frame_header(copy, sizeof copy));
  }
  write_link_frame_header({3, 1}, fh); // no room for the channel
  CHECK_FALSE(parse_link_frame_header(fh, sizeof fh));
  write_link_frame_header({link_max_meta_bytes + 1, 1}, fh);
  CHECK_FALSE(parse_link_frame_header(fh, sizeof fh));
  write_link_frame_header({64, link_max_payload_bytes + 1}, fh);
  CHECK_FALSE(parse_link_frame_header(fh, sizeof fh));
  write_link_frame_header({64, uint64_t{1} << 40}, fh);
  auto big = parse_link_frame_header(fh, sizeof fh);
  REQUIRE_FALSE(big);
  CHECK(big.error().what.find("declares") != std::string::npos);

  // A transfer status round trips; truncations, a byte too many and long texts are refused.
  auto status = encode_transfer_status(t, "refused");
  auto s = decode_transfer_status(status.data(), status.size());
  REQUIRE(s);
  CHECK(s->first == t);
  CHECK(s->second == "refused");
  for (size_t n = 0; n < status.size(); ++n)
    CHECK_FALSE(decode_transfer_status(status.data(), n));
  status.push_back(0);
  CHECK_FALSE(decode_transfer_status(status.data(), status.size()));
  auto cut = encode_transfer_status(t, std::string(10000, 'x'));
  CHECK(cut.size() == t.size() + 4 + max_status_bytes);

  auto hex = token_to_hex(t);
  CHECK(hex.size() == 32);
  auto tb = token_from_hex(hex);
  REQUIRE(tb);
  CHECK(*tb == t);
  CHECK_FALSE(token_from_hex(hex.substr(1)));
  CHECK_FALSE(token_from_hex(std::string(32, 'g')));
  CHECK_FALSE(token_from_hex(std::string(32, 'A')));

  for (auto host : {"127.0.0.1", "10.77.0.3", "192.168.1.5", "localhost"})
    CHECK_MESSAGE(check_listen_host(host).ok(), host);
  for (auto host : {"0.0.0.0", "", "127.0.0", "::1", "example.org", "localhost.evil"})
    CHECK_FALSE_MESSAGE(check_listen_host(host).ok(), host);
}

TEST_CASE("transport: frames cross a link both ways, a shared frame reaches two peers") {
  transports w(3);
  w.link(0, 1);
  w.link(0, 2);
  CHECK(w.t[0]->linked(w.t[1]->id()));
  CHECK(w.t[0]->linked(w.t[2]->id()));
  CHECK_FALSE(w.t[0]->linked("nobody"));
  torch::manual_seed(3);
  auto x = torch::randn({100000});
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1, 2, 3}, x.narrow(0, 10, 5000))));
  auto got = w.c[1]->next();
  REQUIRE(got);
  CHECK(got->peer == w.t[0]->id());
  CHECK(got->body == std::vector<uint8_t>{1, 2, 3});
  REQUIRE(got->payload.ok());
  CHECK(torch::equal(got->payload.tensor, x.narrow(0, 10, 5000)));
  // The link node 0 opened carries node 1's answer back (no second connection).
  REQUIRE(w.t[1]->linked(w.t[0]->id()));
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({9})));
  auto back = w.c[0]->next();
  REQUIRE(back);
  CHECK(back->peer == w.t[1]->id());
  CHECK(back->body == std::vector<uint8_t>{9});
  CHECK_FALSE(back->payload.tensor.defined());
  // One fp16 frame shared by both links: encoded once, both get the same values.
  auto shared = w.frame({7}, x, kernels::codec_id::fp16);
  REQUIRE(w.t[0]->send(w.t[1]->id(), shared));
  REQUIRE(w.t[0]->send(w.t[2]->id(), shared));
  for (size_t i : {1, 2}) {
    auto g = w.c[i]->next();
    REQUIRE(g);
    REQUIRE(g->payload.ok());
    CHECK(g->payload.codec == kernels::codec_id::fp16);
    auto err = (g->payload.tensor.to(torch::kFloat32) - x).abs().max().item<double>();
    CHECK(err < 1e-2);
    CHECK(err > 0); // really compressed
  }
  CHECK(w.t[0]->connections_opened() == 2);
  CHECK(w.t[1]->connections_opened() == 0);
  CHECK(w.t[1]->failed() == 0);
  // What went to each peer was counted with the time spent writing it. The link's writer counts
  // a frame after writing it, which may be after the peer read it: a last frame on the same
  // link, read by the peer, was written after that count.
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({8})));
  auto marker = w.c[1]->next();
  REQUIRE(marker);
  CHECK(marker->body == std::vector<uint8_t>{8});
  auto to1 = w.t[0]->written(w.t[1]->id());
  CHECK(to1.bytes > 5000 * 4 + 100000 * 2);
  CHECK(to1.seconds > 0);
  CHECK(w.t[0]->written("nobody").bytes == 0);
}

TEST_CASE("transport: links are pooled: asking again for a linked peer opens nothing") {
  transports w(2);
  for (int i = 0; i < 20; ++i) {
    w.link(0, 1); // the second token onwards is never used
    REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({static_cast<uint8_t>(i)}, torch::ones({64}))));
    auto g = w.c[1]->next();
    REQUIRE(g);
    CHECK(g->body[0] == i);
  }
  CHECK(w.t[0]->connections_opened() == 1);
}

TEST_CASE("transport: a client-mode transport (no listener) sends and receives over the link it "
          "opened") {
  transport_options client;
  client.host.clear();
  transports w({client, transport_options{}});
  CHECK(w.t[0]->port() == 0);
  CHECK(w.t[0]->id().rfind("client-", 0) == 0);
  CHECK_FALSE(w.t[1]->linked(w.t[0]->id()));
  w.link(0, 1);
  auto x = torch::arange(1000, torch::kFloat32);
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1}, x)));
  auto up = w.c[1]->next();
  REQUIRE(up);
  CHECK(up->peer == w.t[0]->id());
  CHECK(torch::equal(up->payload.tensor, x));
  // The listening side answers over that link: the client accepts no connections.
  REQUIRE(w.t[1]->linked(w.t[0]->id()));
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({2}, x * 2)));
  auto down = w.c[0]->next();
  REQUIRE(down);
  CHECK(down->peer == w.t[1]->id());
  CHECK(torch::equal(down->payload.tensor, x * 2));
  CHECK(w.t[1]->connections_opened() == 0);
  // Both sides were told that the link is up.
  std::lock_guard<std::mutex> g0{w.c[0]->mu};
  std::lock_guard<std::mutex> g1{w.c[1]->mu};
  CHECK(w.c[0]->ups == std::vector<std::string>{w.t[1]->id()});
  CHECK(w.c[1]->ups == std::vector<std::string>{w.t[0]->id()});
}

TEST_CASE("transport: unknown tokens, garbage, oversize and non-tensor frames close the link and "
          "deliver nothing") {
  transport_options o;
  o.max_payload_bytes = 1 << 20;
  o.io_timeout = 2s;
  transports w(1, o);
  auto port = w.t[0]->port();
  auto meta = make_link_meta(w.channel, {1, 2, 3});
  {
    raw_link c(port); // a token nobody issued
    preamble(c, link_token{});
    CHECK(c.closed_by_peer());
  }
  auto token = token_from_hex(w.t[0]->issue("mallory"));
  REQUIRE(token);
  {
    raw_link c(port); // a valid token, then garbage instead of a frame header
    preamble(c, *token);
    std::vector<uint8_t> junk(64, 0xab);
    c.write(junk.data(), junk.size());
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // the token was one-time: a second link with it is refused
    preamble(c, *token);
    CHECK(c.closed_by_peer());
  }
  auto next_token = [&] {
    auto t = token_from_hex(w.t[0]->issue("mallory"));
    REQUIRE(t);
    return *t;
  };
  {
    raw_link c(port); // a payload above the transport's limit
    preamble(c, next_token());
    frame_head(c, meta, (1 << 20) + 1);
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // a frame above the protocol's limit
    preamble(c, next_token());
    frame_head(c, meta, uint64_t{1} << 40);
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // a well-framed payload that is not a tensor
    preamble(c, next_token());
    std::vector<uint8_t> payload(256, 0x5a);
    frame_head(c, meta, payload.size());
    c.write(payload.data(), payload.size());
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // a tensor the channel refuses (2-D where 1-D is expected)
    preamble(c, next_token());
    messages::tensor_msg m;
    m.tensor = torch::ones({4, 4});
    std::vector<char> bytes;
    REQUIRE(messages::save_tensor(m, bytes).ok());
    frame_head(c, meta, bytes.size());
    c.write(bytes.data(), bytes.size());
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // half a payload, then silence: the io timeout closes it
    preamble(c, next_token());
    frame_head(c, meta, 4096);
    std::vector<uint8_t> half(2048, 0);
    c.write(half.data(), half.size());
    CHECK(c.closed_by_peer());
  }
  CHECK(w.t[0]->delivered() == 0);
  CHECK(w.t[0]->failed() >= 8);
  CHECK_FALSE(w.c[0]->next(0ms));
  // A frame for a channel nobody has is read and dropped; the link goes on.
  {
    raw_link c(port);
    preamble(c, next_token());
    auto other = make_link_meta(w.channel + 1, {5});
    frame_head(c, other, 0);
    auto mine = make_link_meta(w.channel, {6});
    frame_head(c, mine, 0);
    auto g = w.c[0]->next();
    REQUIRE(g);
    CHECK(g->body == std::vector<uint8_t>{6});
  }
}

TEST_CASE("transport: a link reads no further while its handlers hold link_buffers payloads") {
  transport_options o;
  o.link_buffers = 2;
  transports w(2, o);
  w.link(0, 1);
  auto x = torch::randn({1000});
  for (int i = 0; i < 5; ++i)
    REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({static_cast<uint8_t>(i)}, x)));
  auto first = w.c[1]->next();
  auto second = w.c[1]->next();
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->body[0] == 0);
  CHECK(second->body[0] == 1);
  // Both slots are held: the third frame stays in the socket.
  CHECK_FALSE(w.c[1]->next(300ms));
  CHECK(w.t[1]->delivered() == 2);
  // A copy of the tensor still holds the slot; dropping the last one frees it.
  auto copy = first->payload.tensor;
  first.reset();
  CHECK_FALSE(w.c[1]->next(100ms));
  copy.reset();
  auto third = w.c[1]->next();
  REQUIRE(third);
  CHECK(third->body[0] == 2);
  CHECK(torch::equal(third->payload.tensor, x));
  // Two slots held again (second, third) while the fourth waits: stopping wakes the reader.
  w.t[1]->stop();
}

TEST_CASE("transport: 300 payloads through one link reuse their buffers (resident memory flat)") {
  transports w(2);
  w.link(0, 1);
  auto x = torch::randn({1 << 18}); // 1 MiB
  uint64_t early_peak = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    // Uncompressed payloads alias their receive buffer, fp16 ones decode into a pooled one.
    auto codec = i % 2 == 0 ? kernels::codec_id::none : kernels::codec_id::fp16;
    REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({}, x, codec)));
    auto got = w.c[1]->next();
    REQUIRE(got);
    CHECK(got->payload.tensor.numel() == x.numel());
    got.reset(); // the buffer goes back to the pool
    last = rss_bytes();
    if (i < 50)
      early_peak = std::max(early_peak, last);
  }
  MESSAGE("rss over the first 50 payloads (peak): " << early_peak / 1024 << " KiB; after 300: "
                                                     << last / 1024 << " KiB");
  // 300 MiB went through: keeping even one payload in ten would add 25 MiB.
  CHECK(last <= early_peak + (uint64_t{4} << 20));
}

TEST_CASE("transport: a link that cannot be opened is reported lost, then nothing is linked") {
  transports w(2);
  auto token = w.t[1]->issue(w.t[0]->id());
  auto port = w.t[1]->port();
  w.t[1]->stop(); // nothing listens there any more
  REQUIRE(w.t[0]->connect("peer1", "127.0.0.1", port, token));
  auto lost = w.c[0]->lost();
  REQUIRE(lost);
  CHECK(lost->first == "peer1");
  CHECK(lost->second.find("connect") != std::string::npos);
  CHECK_FALSE(w.t[0]->linked("peer1"));
  CHECK_FALSE(w.t[0]->send("peer1", w.frame({1})));
  CHECK_FALSE(w.t[0]->connect("peer1", "127.0.0.1", port, "not-a-token"));
  CHECK_FALSE(w.t[0]->connect("peer1", "example.org", port, token));
  CHECK_FALSE(transport::open(transport_options{"example.org"}));
}

TEST_CASE("transport: TCP links take the congestion control asked for, a name that is no "
          "algorithm's is refused, one the kernel lacks leaves the system's") {
  // A socket's algorithm is set and read back (reno is built into every Linux kernel).
  std::string why;
  uint16_t port = 0;
  int lfd = listen_ipv4("127.0.0.1", 0, port, why);
  REQUIRE_MESSAGE(lfd >= 0, why);
  int fd = connect_ipv4("127.0.0.1", port, 0, why, std::chrono::milliseconds{2000});
  REQUIRE_MESSAGE(fd >= 0, why);
  REQUIRE(set_congestion_control(fd, "reno"));
  CHECK(congestion_control_of(fd) == "reno");
  CHECK_FALSE(set_congestion_control(fd, "no_such_cc"));
  CHECK(congestion_control_of(fd) == "reno");
  ::close(fd);
  ::close(lfd);

  CHECK(congestion_control_name("cubic"));
  CHECK(congestion_control_name("bbr2_x"));
  for (std::string bad : {"", "Cubic", "cu bic", "cubic;rm", "a_name_too_long_16"})
    CHECK_FALSE(congestion_control_name(bad));

  transport_options o;
  o.congestion_control = "BBR!"; // not an algorithm's name: a configuration error
  auto refused = transport::open(o);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().what.find("congestion control") != std::string::npos);

  o.congestion_control = "no_such_cc"; // well-formed, but no kernel has it
  auto fallback = transport::open(o);
  REQUIRE(fallback);
  CHECK((*fallback)->congestion_control().empty());
  CHECK((*fallback)->last_error().find("no_such_cc") != std::string::npos);
  CHECK((*fallback)->failed() == 0);
  (*fallback)->stop();

  auto dflt = transport::open(transport_options{});
  REQUIRE(dflt);
  if (check_congestion_control("cubic").empty()) {
    CHECK((*dflt)->congestion_control() == "cubic");
    CHECK((*dflt)->last_error().empty());
  } else {
    CHECK((*dflt)->congestion_control().empty());
  }
  (*dflt)->stop();
}

} // namespace starling::test::actors_transport_test
