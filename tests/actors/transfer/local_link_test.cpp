// Same-host links of the direct transport (transport_options::local_links): frames cross a
// Unix-socket link both ways with their payloads in shared-memory rings (read in place), also
// from a client-mode transport; the transport falls back to TCP when the peer's local socket is
// missing or refuses; hostile rings, ring positions and ring frames close the link with a
// counted reason and deliver nothing.
#include "actors/transfer/transport.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <thread>
#include <unistd.h>

#include <torch/torch.h>

#include "actors/transfer/link_frame.hpp"
#include "actors/transfer/shm_ring.hpp"
#include "actors/transfer/socket_io.hpp"
#include "support/channel_collector.hpp"
#include "support/raw_socket.hpp"

namespace starling::test::actors_local_link_test {

using namespace starling;
using namespace starling::actors::transfer;
using namespace std::chrono_literals;
using starling::testing::collector;
using starling::testing::transports;

namespace {

/// The name of the mapping of this process that holds `p` (from /proc/self/maps).
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi)
      return line;
  }
  return {};
}

bool in_ring(const at::Tensor& t) {
  return mapping_of(t.data_ptr()).find("starling-link-ring") != std::string::npos;
}

/// A hand-written same-host link: the Unix socket of a listening transport.
struct raw_local {
  int fd = -1;
  int their_ring = -1;

  explicit raw_local(const std::string& name) {
    std::string why;
    fd = connect_local(name, why);
    REQUIRE_MESSAGE(fd >= 0, why);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~raw_local() {
    ::close(fd);
    if (their_ring >= 0)
      ::close(their_ring);
  }
  raw_local(const raw_local&) = delete;
  raw_local& operator=(const raw_local&) = delete;

  /// Sends a local preamble with `token` and the ring `ring` (none when negative); true when
  /// the listener acknowledged it.
  bool open(const link_token& token, int ring) {
    uint8_t pre[link_preamble_bytes];
    write_link_preamble(token, pre, link_local_version);
    if (!send_with_fd(fd, pre, sizeof pre, ring))
      return false;
    uint8_t ack = 0;
    return recv_with_fd(fd, &ack, 1, their_ring).ok() && ack == link_local_ack;
  }
  void write(const void* p, size_t n) { (void) send_all(fd, p, n); }
  /// A ring frame: header, meta and position.
  void ring_frame(const std::vector<uint8_t>& meta, uint64_t payload, uint64_t pos) {
    uint8_t fh[link_frame_header_bytes];
    write_link_frame_header({static_cast<uint32_t>(meta.size()), payload, true}, fh);
    write(fh, sizeof fh);
    write(meta.data(), meta.size());
    uint8_t raw[link_ring_position_bytes];
    write_le(raw, pos, 8);
    write(raw, sizeof raw);
  }
  bool closed_by_peer() {
    char c;
    return ::recv(fd, &c, 1, 0) <= 0;
  }
};

/// Encodes a 1-D fp32 tensor as a payload.
std::vector<char> encoded(const at::Tensor& t) {
  messages::tensor_msg m;
  m.tensor = t;
  std::vector<char> bytes;
  REQUIRE(messages::save_tensor(m, bytes).ok());
  return bytes;
}

} // namespace

TEST_CASE("local link: frames cross a same-host link both ways, payloads read in place from the "
          "sender's ring") {
  transports w({transport_options{}, transport_options{}});
  w.link(0, 1);
  torch::manual_seed(5);
  auto x = torch::randn({200000}); // 800 KB: within half the default ring
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1}, x)));
  auto got = w.c[1]->next();
  REQUIRE(got);
  CHECK(got->peer == w.t[0]->id());
  REQUIRE(got->payload.ok());
  CHECK(torch::equal(got->payload.tensor, x));
  CHECK(in_ring(got->payload.tensor)); // one copy: the sender's into its ring
  CHECK(w.t[0]->local_links_opened() == 1);
  CHECK(w.t[0]->connections_opened() == 1);
  CHECK(w.t[0]->local_link(w.t[1]->id())); // both ends know (codec: auto takes fp32 over it)
  CHECK(w.t[1]->local_link(w.t[0]->id()));
  CHECK_FALSE(w.t[0]->local_link("127.0.0.1:1"));
  // The answer comes back over the same link, through the other side's ring; a compressed
  // payload is copied out of the ring and decoded; a frame without payload has no ring part.
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({2}, x * 3)));
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({3}, x, kernels::codec_id::fp16)));
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({4})));
  auto back = w.c[0]->next();
  REQUIRE(back);
  CHECK(back->body == std::vector<uint8_t>{2});
  CHECK(torch::equal(back->payload.tensor, x * 3));
  CHECK(in_ring(back->payload.tensor));
  auto half = w.c[0]->next();
  REQUIRE(half);
  CHECK(half->payload.codec == kernels::codec_id::fp16);
  CHECK_FALSE(in_ring(half->payload.tensor));
  CHECK((half->payload.tensor.to(torch::kFloat32) - x).abs().max().item<double>() < 1e-2);
  auto empty = w.c[0]->next();
  REQUIRE(empty);
  CHECK(empty->body == std::vector<uint8_t>{4});
  CHECK_FALSE(empty->payload.tensor.defined());
  CHECK(w.t[1]->connections_opened() == 0);
  got.reset(); // a held payload holds its ring's region (and the regions after it)
  back.reset();
  // 60 payloads of 1 MiB each way at once through 2 MiB rings: positions lap the rings many
  // times while the writers wait for room (or, while the handlers hold what the ring has, send
  // on the socket); every payload arrives intact.
  int through_ring = 0;
  std::vector<at::Tensor> sent;
  for (int i = 0; i < 60; ++i)
    sent.push_back(torch::full({1 << 18}, static_cast<float>(i)));
  for (int i = 0; i < 60; ++i) {
    REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({static_cast<uint8_t>(i)}, sent[i])));
    REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({static_cast<uint8_t>(i)}, sent[i] * -1)));
  }
  for (int i = 0; i < 60; ++i) {
    auto a = w.c[1]->next();
    auto b = w.c[0]->next();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->body[0] == i);
    CHECK(b->body[0] == i);
    CHECK(torch::equal(a->payload.tensor, sent[i]));
    CHECK(torch::equal(b->payload.tensor, sent[i] * -1));
    through_ring += in_ring(a->payload.tensor) ? 1 : 0;
  }
  MESSAGE(through_ring << " of 60 payloads read in place");
  CHECK(through_ring >= 1); // the first: the rings are empty then
  CHECK(w.t[0]->failed() == 0);
  CHECK(w.t[1]->failed() == 0);
  CHECK(w.t[1]->refusals().empty());
}

TEST_CASE("local link: payloads above half the ring and rings turned off cross the Unix socket") {
  transport_options small;
  small.ring_bytes = 64 << 10;
  transport_options none;
  none.ring_bytes = 0;
  transports w({small, none});
  w.link(0, 1);
  auto big = torch::arange(20000, torch::kFloat32);  // 80 KB: above 32 KiB, on the socket
  auto little = torch::arange(2000, torch::kFloat32); // 8 KB: in the ring
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1}, big)));
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({2}, little)));
  auto a = w.c[1]->next();
  auto b = w.c[1]->next();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(torch::equal(a->payload.tensor, big));
  CHECK_FALSE(in_ring(a->payload.tensor));
  CHECK(torch::equal(b->payload.tensor, little));
  CHECK(in_ring(b->payload.tensor));
  // The side without a ring sends everything on the socket.
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({3}, little)));
  auto c = w.c[0]->next();
  REQUIRE(c);
  CHECK(torch::equal(c->payload.tensor, little));
  CHECK_FALSE(in_ring(c->payload.tensor));
  CHECK(w.t[0]->local_links_opened() == 1);
}

TEST_CASE("local link: a client-mode transport links over the same-host socket, both ways") {
  transport_options client;
  client.host.clear();
  transports w({client, transport_options{}});
  w.link(0, 1);
  auto x = torch::arange(100000, torch::kFloat32);
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1}, x)));
  auto up = w.c[1]->next();
  REQUIRE(up);
  CHECK(up->peer == w.t[0]->id());
  CHECK(torch::equal(up->payload.tensor, x));
  CHECK(in_ring(up->payload.tensor));
  REQUIRE(w.t[1]->send(w.t[0]->id(), w.frame({2}, x * 2)));
  auto down = w.c[0]->next();
  REQUIRE(down);
  CHECK(torch::equal(down->payload.tensor, x * 2));
  CHECK(in_ring(down->payload.tensor));
  CHECK(w.t[0]->local_links_opened() == 1);
}

namespace {

/// Links transport 0 to 1 and sends a tensor, which must arrive over TCP, not a local link.
void sends_over_tcp(transports& w) {
  w.link(0, 1);
  auto x = torch::arange(5000, torch::kFloat32);
  REQUIRE(w.t[0]->send(w.t[1]->id(), w.frame({1}, x)));
  auto got = w.c[1]->next();
  REQUIRE(got);
  CHECK(torch::equal(got->payload.tensor, x));
  CHECK_FALSE(in_ring(got->payload.tensor));
  CHECK(w.t[0]->connections_opened() == 1);
  CHECK(w.t[0]->local_links_opened() == 0);
  CHECK_FALSE(w.t[0]->local_link(w.t[1]->id()));
  CHECK_FALSE(w.t[1]->local_link(w.t[0]->id()));
}

} // namespace

TEST_CASE("local link: without the peer's local socket, or when it refuses, the link is TCP") {
  SUBCASE("the listener has local links off") {
    transport_options off;
    off.local_links = false;
    transports w({transport_options{}, off});
    sends_over_tcp(w);
  }
  SUBCASE("another process's socket holds the name and refuses") {
    // A free port, then a socket on the local name the transport on that port would take.
    uint16_t port = 0;
    std::string why;
    int probe = listen_ipv4("127.0.0.1", 0, port, why);
    REQUIRE(probe >= 0);
    ::close(probe);
    int squat = listen_local(local_link_name("127.0.0.1", port), why);
    REQUIRE_MESSAGE(squat >= 0, why);
    int refused = 0;
    std::thread squatter([&] { // accepts one link and closes it without an acknowledgement
      int c = ::accept(squat, nullptr, nullptr);
      if (c >= 0) {
        ++refused;
        ::close(c);
      }
    });
    transport_options at_port;
    at_port.port = port;
    {
      transports w({transport_options{}, at_port});
      REQUIRE(w.t[1]->port() == port);
      sends_over_tcp(w);
    }
    squatter.join();
    ::close(squat);
    CHECK(refused == 1);
  }
}

TEST_CASE("local link: hostile rings, ring positions and ring frames close the link with a "
          "counted reason") {
  transport_options o;
  o.io_timeout = 2s;
  transports w({o});
  auto& t = *w.t[0];
  auto name = local_link_name(t.host(), t.port());
  auto meta = make_link_meta(w.channel, {1});
  auto token = [&] {
    auto k = token_from_hex(t.issue("mallory"));
    REQUIRE(k);
    return *k;
  };
  auto ring_count = [&] {
    auto r = t.refusals();
    return r.count("ring") != 0 ? r.at("ring") : uint64_t{0};
  };
  auto ring = ring_map::create(ring_default_bytes);
  REQUIRE(ring);
  auto payload = encoded(torch::arange(2000, torch::kFloat32)); // above the 4 KiB copied
  {
    // A well-formed payload at the one right position is delivered, read in place.
    raw_local c(name);
    REQUIRE(c.open(token(), (*ring)->fd()));
    CHECK(c.their_ring >= 0);
    std::memcpy((*ring)->at(0), payload.data(), payload.size());
    c.ring_frame(meta, payload.size(), 0);
    auto got = w.c[0]->next();
    REQUIRE(got);
    CHECK(torch::equal(got->payload.tensor, torch::arange(2000, torch::kFloat32)));
    CHECK(in_ring(got->payload.tensor));
    // Freed: the reader's release position reaches the payload's end.
    got.reset();
    CHECK((*ring)->tail().load() == payload.size());
    // The next one claimed anywhere but where it must lie.
    c.ring_frame(meta, payload.size(), 0);
    CHECK(c.closed_by_peer());
  }
  CHECK(ring_count() == 1);
  {
    raw_local c(name); // a payload larger than the ring
    REQUIRE(c.open(token(), (*ring)->fd()));
    c.ring_frame(meta, ring_default_bytes + 8, 0);
    CHECK(c.closed_by_peer());
  }
  CHECK(ring_count() == 2);
  {
    raw_local c(name); // a ring frame on a link that passed no ring
    REQUIRE(c.open(token(), -1));
    c.ring_frame(meta, payload.size(), 0);
    CHECK(c.closed_by_peer());
  }
  CHECK(ring_count() == 3);
  {
    // A ring that is not sealed against shrinking (the peer could cut it under the reader's
    // mapping) is refused before the acknowledgement.
    int loose = ::memfd_create("loose", MFD_CLOEXEC);
    REQUIRE(loose >= 0);
    REQUIRE(::ftruncate(loose, ring_control_bytes + ring_default_bytes) == 0);
    raw_local c(name);
    CHECK_FALSE(c.open(token(), loose));
    ::close(loose);
  }
  CHECK(ring_count() == 4);
  {
    starling::testing::raw_socket tcp(t.port()); // a ring frame over TCP
    uint8_t pre[link_preamble_bytes];
    write_link_preamble(token(), pre);
    tcp.write(pre, sizeof pre);
    uint8_t fh[link_frame_header_bytes];
    write_link_frame_header({static_cast<uint32_t>(meta.size()), 64, true}, fh);
    tcp.write(fh, sizeof fh);
    tcp.write(meta.data(), meta.size());
    uint8_t pos[link_ring_position_bytes] = {};
    tcp.write(pos, sizeof pos);
    CHECK(tcp.closed_by_peer());
  }
  CHECK(ring_count() == 5);
  {
    // Garbage at the right position is not a tensor: refused (the ordinary decode failure), and
    // the ring's region is given back.
    auto fresh = ring_map::create(ring_default_bytes);
    REQUIRE(fresh);
    raw_local c(name);
    REQUIRE(c.open(token(), (*fresh)->fd()));
    std::memset((*fresh)->at(0), 0x5a, 256);
    c.ring_frame(meta, 256, 0);
    CHECK(c.closed_by_peer());
    CHECK((*fresh)->tail().load() == 256);
  }
  CHECK(ring_count() == 5);
  CHECK(t.delivered() == 1);
  CHECK_FALSE(w.c[0]->next(0ms));
}

TEST_CASE("local link: ring positions: the writer waits for room while payloads are unread, "
          "the reader accepts only the next place") {
  auto ring = ring_map::create(ring_min_bytes);
  REQUIRE(ring);
  auto cap = (*ring)->capacity();
  CHECK(ring_place(0, 100, cap) == 0);
  CHECK(ring_place(100, 100, cap) == 128);
  CHECK(ring_place(cap - 64, 100, cap) == cap); // would cross the end: the next lap
  ring_writer wr{*ring};
  ring_reader rd{*ring};
  auto a = wr.reserve(cap / 2, 1s, 1s);
  auto b = wr.reserve(cap / 2, 1s, 1s);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(*a);
  REQUIRE(*b);
  CHECK(rd.claim(**a, cap / 2));
  // Full with a payload unread: the writer waits, up to its timeout.
  CHECK_FALSE(wr.reserve(64, 50ms, 10s));
  // Releasing the first frees its half; a writer waiting meanwhile is woken.
  std::thread later([&] { rd.release(**a); });
  auto c = wr.reserve(64, 10s, 10s);
  later.join();
  REQUIRE(c);
  REQUIRE(*c);
  CHECK(**c == cap);
  CHECK((*ring)->tail().load() == cap / 2);
  CHECK_FALSE(rd.claim(**c, 64)); // the second payload comes first
  CHECK(rd.claim(**b, cap / 2));
  CHECK_FALSE(rd.claim(**c + 64, 64)); // not where it must lie
  CHECK(rd.claim(**c, 64));
  CHECK_FALSE(rd.claim(cap * 2, cap + 8)); // larger than the ring
  // Every payload read and held, no room: none (the socket) after the grace period, then at
  // once while nothing is released.
  auto t0 = std::chrono::steady_clock::now();
  auto d = wr.reserve(cap / 2 + 64, 10s, 30ms);
  REQUIRE(d);
  CHECK_FALSE(*d);
  CHECK(std::chrono::steady_clock::now() - t0 >= 30ms);
  auto e = wr.reserve(cap / 2 + 64, 10s, 10s);
  REQUIRE(e);
  CHECK_FALSE(*e);
  // Released out of order: the position moves over the released prefix only.
  rd.release(**c);
  CHECK((*ring)->tail().load() == cap / 2);
  rd.release(**b);
  CHECK((*ring)->tail().load() == cap + 64);
  // A release position beyond what was written is a broken peer: the writer gives up.
  (*ring)->tail().store(cap * 5);
  CHECK_FALSE(wr.reserve(64, 1s, 1s));
}

} // namespace starling::test::actors_local_link_test
