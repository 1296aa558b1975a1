// The sealed direct links of a closed run (link_crypto.hpp): the handshake's and the records'
// decoders, two sealed transports exchanging tensors that never cross the socket in plaintext,
// and every hostile link (wrong key, forged handshake, plaintext, tampered, replayed or malformed
// record) refused with its reason counted.
#include "actors/transfer/link_crypto.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <netinet/in.h>
#include <optional>
#include <set>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include <torch/torch.h>

#include "actors/auth/identity.hpp"
#include "actors/transfer/socket_io.hpp"
#include "actors/transfer/transport.hpp"
#include "support/channel_collector.hpp"
#include "support/raw_socket.hpp"

namespace starling::test::actors_sealed_link_test {

using namespace starling;
using namespace starling::actors::transfer;
using namespace std::chrono_literals;
namespace auth = starling::actors::auth;

namespace {

/// The closed run's admitted node keys (what the node gate would say).
struct gate_keys {
  std::mutex mu;
  std::set<std::string> admitted;

  void admit(const auth::key_pair& k) {
    std::lock_guard<std::mutex> g{mu};
    admitted.insert(k.peer_id());
  }
  std::function<std::string(const std::string&)> check() {
    return [this](const std::string& peer_id) {
      std::lock_guard<std::mutex> g{mu};
      return admitted.count(peer_id) != 0 ? std::string{}
                                          : std::string{"refused (no_hello): not admitted"};
    };
  }
};

constexpr const char* experiment = "sealed-run";

std::shared_ptr<const link_security> security(const auth::key_pair& k, gate_keys& gate,
                                              uint8_t ciphers = 0) {
  auto s = std::make_shared<link_security>();
  s->key = std::make_shared<const auth::key_pair>(k);
  s->experiment = experiment;
  s->admit = gate.check();
  s->ciphers = ciphers;
  return s;
}

struct node_side {
  std::shared_ptr<transport> t;
  std::shared_ptr<starling::testing::collector> in =
    std::make_shared<starling::testing::collector>();
  uint32_t channel = 0;

  explicit node_side(std::shared_ptr<const link_security> sec) {
    transport_options o;
    o.io_timeout = 3s;
    o.security = std::move(sec);
    auto x = transport::open(o);
    REQUIRE_MESSAGE(x, (x ? std::string{} : x.error().what));
    t = *x;
    channel = t->add_channel(in);
  }
  ~node_side() { t->stop(); }
};

/// Forwards one TCP connection to `target_port` and keeps what went each way.
struct recording_proxy {
  int listen_fd = -1;
  uint16_t port = 0;
  uint16_t target;
  std::mutex mu;
  std::vector<uint8_t> up;   // connector -> acceptor
  std::vector<uint8_t> down; // acceptor -> connector
  std::thread acceptor;
  std::vector<std::thread> pumps;
  std::vector<int> fds;

  explicit recording_proxy(uint16_t target_port) : target(target_port) {
    std::string why;
    listen_fd = listen_ipv4("127.0.0.1", 0, port, why);
    REQUIRE_MESSAGE(listen_fd >= 0, why);
    acceptor = std::thread([this] {
      int in = ::accept(listen_fd, nullptr, nullptr);
      if (in < 0)
        return;
      std::string why;
      int out = connect_ipv4("127.0.0.1", target, 0, why);
      if (out < 0) {
        ::close(in);
        return;
      }
      {
        std::lock_guard<std::mutex> g{mu};
        fds = {in, out};
      }
      pumps.emplace_back([this, in, out] { pump(in, out, up); });
      pumps.emplace_back([this, in, out] { pump(out, in, down); });
    });
  }

  void pump(int from, int to, std::vector<uint8_t>& log) {
    std::vector<uint8_t> buf(1 << 16);
    for (;;) {
      auto r = ::recv(from, buf.data(), buf.size(), 0);
      if (r <= 0)
        break;
      {
        std::lock_guard<std::mutex> g{mu};
        log.insert(log.end(), buf.begin(), buf.begin() + r);
      }
      if (!send_all(to, buf.data(), static_cast<size_t>(r)))
        break;
    }
    ::shutdown(to, SHUT_WR);
  }

  ~recording_proxy() {
    ::shutdown(listen_fd, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> g{mu};
      for (int fd : fds)
        ::shutdown(fd, SHUT_RDWR);
    }
    acceptor.join();
    for (auto& p : pumps)
      p.join();
    for (int fd : fds)
      ::close(fd);
    ::close(listen_fd);
  }
};

/// True when any 64-byte window of `needle` occurs in `hay`.
bool leaks(const std::vector<uint8_t>& hay, const uint8_t* needle, size_t n) {
  for (size_t off = 0; off + 64 <= n; off += size_t{1} << 16) {
    auto it = std::search(hay.begin(), hay.end(), needle + off, needle + off + 64);
    if (it != hay.end())
      return true;
  }
  return false;
}

void read_exact(starling::testing::raw_socket& c, void* p, size_t n) {
  size_t got = 0;
  REQUIRE(recv_all(c.fd, p, n, got).ok());
}

/// A hand-written connector that completes the handshake with `key` (the test's own code, so
/// it can send what an honest transport never would).
struct raw_sealed {
  starling::testing::raw_socket c;
  std::optional<record_cipher> tx;

  raw_sealed(uint16_t port, const auth::key_pair& key, const link_token& token) : c(port) {
    timeval tv{10, 0};
    ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    link_handshake hs{key, experiment, token};
    uint8_t pre[link_preamble_bytes];
    write_sealed_preamble(token, pre);
    c.write(pre, sizeof pre);
    auto hello = hs.hello();
    c.write(hello.data(), hello.size());
    uint8_t reply[link_reply_bytes];
    read_exact(c, reply, sizeof reply);
    REQUIRE(hs.on_reply(reply, sizeof reply).ok());
    auto fin = hs.finish();
    c.write(fin.data(), fin.size());
    tx.emplace(hs.session().cipher, hs.session().tx);
  }

  /// `plain` sealed as one record.
  std::vector<uint8_t> record(const std::vector<uint8_t>& plain) {
    std::vector<uint8_t> out(plain.size() + sealed_header_bytes + sealed_tag_bytes);
    tx->seal(plain.data(), plain.size(), out.data());
    return out;
  }
};

/// A frame without payload on `channel`: header and meta, as the frame layer writes them.
std::vector<uint8_t> bare_frame(uint32_t channel, uint8_t body) {
  auto meta = make_link_meta(channel, {body});
  std::vector<uint8_t> out(link_frame_header_bytes);
  write_link_frame_header({static_cast<uint32_t>(meta.size()), 0}, out.data());
  out.insert(out.end(), meta.begin(), meta.end());
  return out;
}

link_token token_of(const std::string& hex) {
  auto t = token_from_hex(hex);
  REQUIRE(t);
  return *t;
}

uint64_t refused(const transport& t, const std::string& reason) {
  auto r = t.refusals();
  auto i = r.find(reason);
  return i == r.end() ? 0 : i->second;
}

} // namespace

TEST_CASE("sealed link: handshake messages and record headers round trip, malformed ones and "
          "altered records are refused") {
  auto a = auth::key_pair::from_test_seed(1);
  auto b = auth::key_pair::from_test_seed(2);
  link_token token{};
  token[0] = 7;
  link_handshake c{a, experiment, token};
  link_handshake s{b, experiment, token};
  auto hello = c.hello();
  auto h = parse_link_hello(hello.data(), hello.size(), 1);
  REQUIRE(h);
  CHECK(h->node_key == a.public_key());
  REQUIRE(s.on_hello(hello.data(), hello.size()));
  auto reply = s.reply();
  REQUIRE(reply);
  REQUIRE(c.on_reply(reply->data(), reply->size()));
  auto fin = c.finish();
  REQUIRE(s.on_finish(fin.data(), fin.size()));
  CHECK(c.session().peer_key == b.public_key());
  CHECK(s.session().peer_key == a.public_key());
  CHECK(c.session().tx == s.session().rx);
  CHECK(c.session().rx == s.session().tx);
  CHECK(c.session().tx != c.session().rx);

  // Every single-bit flip in the fixed head of each message is refused; sizes must be exact.
  for (uint8_t kind = 1; kind <= 3; ++kind) {
    std::vector<uint8_t> m = kind == 1   ? std::vector<uint8_t>(hello.begin(), hello.end())
                             : kind == 2 ? std::vector<uint8_t>(reply->begin(), reply->end())
                                         : std::vector<uint8_t>(fin.begin(), fin.end());
    REQUIRE(parse_link_hello(m.data(), m.size(), kind));
    CHECK_FALSE(parse_link_hello(m.data(), m.size() - 1, kind));
    CHECK_FALSE(parse_link_hello(m.data(), m.size(), static_cast<uint8_t>(kind % 3 + 1)));
    for (size_t bit = 0; bit < 64; ++bit) {
      if (bit / 8 == 5 && kind == 1 && bit % 8 == 0)
        continue; // the AES bit of an offer: both offers are valid
      auto copy = m;
      copy[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
      CHECK_FALSE(parse_link_hello(copy.data(), copy.size(), kind));
    }
  }
  CHECK_FALSE(parse_link_hello(hello.data(), hello.size(), 0));
  CHECK_FALSE(parse_link_hello(hello.data(), hello.size(), 4));
  // A reply signed for another transcript (another token) is refused as forged.
  link_token other = token;
  other[1] = 1;
  link_handshake c2{a, experiment, other};
  (void) c2.hello();
  auto bad = c2.on_reply(reply->data(), reply->size());
  CHECK_FALSE(bad);
  CHECK(c2.forged());
  // A finish for another session is refused as forged, too.
  link_handshake s2{b, experiment, token};
  REQUIRE(s2.on_hello(hello.data(), hello.size()));
  REQUIRE(s2.reply());
  CHECK_FALSE(s2.on_finish(fin.data(), fin.size()));
  CHECK(s2.forged());

  // Preambles: a sealed one is refused by the plaintext parser and the other way round.
  uint8_t pre[link_preamble_bytes];
  write_sealed_preamble(token, pre);
  REQUIRE(parse_sealed_preamble(pre, sizeof pre));
  CHECK_FALSE(parse_link_preamble(pre, sizeof pre));
  write_link_preamble(token, pre);
  CHECK_FALSE(parse_sealed_preamble(pre, sizeof pre));

  // Record headers.
  uint8_t rh[sealed_header_bytes];
  write_sealed_header(1234, rh);
  auto len = parse_sealed_header(rh, sizeof rh);
  REQUIRE(len);
  CHECK(*len == 1234);
  CHECK_FALSE(parse_sealed_header(rh, sizeof rh - 1));
  write_sealed_header(0, rh);
  CHECK_FALSE(parse_sealed_header(rh, sizeof rh));
  write_sealed_header(sealed_max_record + 1, rh);
  CHECK_FALSE(parse_sealed_header(rh, sizeof rh));
  write_sealed_header(10, rh);
  rh[0] ^= 1;
  CHECK_FALSE(parse_sealed_header(rh, sizeof rh));

  // Records, with both ciphers: round trip, then a flipped bit, a replay and a reorder fail.
  std::array<uint8_t, 32> key{};
  key[3] = 9;
  for (uint8_t cipher : {cipher_xchacha20, cipher_aes256gcm}) {
    if (cipher == cipher_aes256gcm && (local_ciphers() & cipher_aes256gcm) == 0)
      continue;
    CAPTURE(cipher_name(cipher));
    record_cipher out{cipher, key};
    std::vector<uint8_t> msg(1000, 0x42);
    std::vector<std::vector<uint8_t>> recs;
    for (int i = 0; i < 3; ++i) {
      std::vector<uint8_t> r(msg.size() + sealed_header_bytes + sealed_tag_bytes);
      out.seal(msg.data(), msg.size(), r.data());
      recs.push_back(r);
    }
    CHECK(recs[0] != recs[1]); // one nonce per record
    auto open = [&](record_cipher& in, std::vector<uint8_t> r) {
      return in.open(r.data(), r.data() + sealed_header_bytes, msg.size(),
                     r.data() + sealed_header_bytes + msg.size());
    };
    record_cipher in{cipher, key};
    auto r0 = recs[0];
    REQUIRE(in.open(r0.data(), r0.data() + sealed_header_bytes, msg.size(),
                    r0.data() + sealed_header_bytes + msg.size()));
    CHECK(std::equal(msg.begin(), msg.end(), r0.begin() + sealed_header_bytes));
    CHECK_FALSE(open(in, recs[0])); // replayed
    record_cipher in2{cipher, key};
    CHECK_FALSE(open(in2, recs[1])); // reordered
    record_cipher in3{cipher, key};
    auto flipped = recs[0];
    flipped[sealed_header_bytes + 17] ^= 4;
    CHECK_FALSE(open(in3, flipped));
    record_cipher in4{cipher, key};
    auto head = recs[0];
    head[4] ^= 1; // the header is the additional data
    CHECK_FALSE(open(in4, head));
  }
}

TEST_CASE("sealed link: two closed-run transports exchange tensors encrypted, the socket never "
          "carries the plaintext") {
  auto ka = auth::key_pair::from_test_seed(11);
  auto kb = auth::key_pair::from_test_seed(12);
  gate_keys gate;
  gate.admit(ka);
  gate.admit(kb);
  // Both ciphers: what this machine has, and XChaCha20-Poly1305 when one side lacks AES-NI.
  for (uint8_t offer : {uint8_t{0}, cipher_xchacha20}) {
    node_side a{security(ka, gate, offer)};
    node_side b{security(kb, gate)};
    CHECK(a.t->sealed());
    recording_proxy proxy{b.t->port()};
    auto token = b.t->issue(a.t->id());
    REQUIRE(a.t->connect(b.t->id(), "127.0.0.1", proxy.port, token));
    // 3 MiB + a bit: several full records and a short one; values that are easy to spot.
    auto x = torch::arange(786500, torch::kFloat32);
    std::vector<uint8_t> body{1, 2, 3};
    REQUIRE(a.t->send(b.t->id(), std::make_shared<outgoing_frame>(a.channel, body, x)));
    auto got = b.in->next();
    REQUIRE(got);
    CHECK(got->peer == a.t->id());
    CHECK((got->body == std::vector<uint8_t>{1, 2, 3}));
    REQUIRE(got->payload.ok());
    CHECK(torch::equal(got->payload.tensor, x));
    // The answer goes back over the same sealed link.
    auto y = x * 3;
    REQUIRE(b.t->send(a.t->id(), std::make_shared<outgoing_frame>(b.channel,
                                                                  std::vector<uint8_t>{9}, y)));
    auto back = a.in->next();
    REQUIRE(back);
    CHECK(torch::equal(back->payload.tensor, y));
    // Small frames without payload, back to back.
    for (uint8_t i = 0; i < 5; ++i)
      REQUIRE(a.t->send(b.t->id(), std::make_shared<outgoing_frame>(
                                     a.channel, std::vector<uint8_t>{i})));
    for (uint8_t i = 0; i < 5; ++i) {
      auto f = b.in->next();
      REQUIRE(f);
      CHECK(f->body == std::vector<uint8_t>{i});
    }
    std::lock_guard<std::mutex> g{proxy.mu};
    CHECK(proxy.up.size() > static_cast<size_t>(x.numel()) * 4);
    CHECK_FALSE(leaks(proxy.up, static_cast<const uint8_t*>(x.data_ptr()), x.numel() * 4));
    CHECK_FALSE(leaks(proxy.down, static_cast<const uint8_t*>(y.data_ptr()), y.numel() * 4));
    CHECK(a.t->failed() == 0);
    CHECK(b.t->failed() == 0);
    CHECK(b.t->refusals().empty());
  }
}

TEST_CASE("sealed link: a key the gate does not admit, a forged handshake and a plaintext link "
          "are refused with counted reasons") {
  auto ka = auth::key_pair::from_test_seed(21);
  auto kb = auth::key_pair::from_test_seed(22);
  auto mallory = auth::key_pair::from_test_seed(23);
  gate_keys gate;
  gate.admit(ka);
  gate.admit(kb);
  node_side b{security(kb, gate)};
  auto port = b.t->port();
  {
    // A transport with a key the gate never admitted: refused after it proved the key.
    gate_keys own;
    own.admit(kb);
    node_side m{security(mallory, own)};
    REQUIRE(m.t->connect(b.t->id(), "127.0.0.1", port, b.t->issue(m.t->id())));
    REQUIRE(m.in->lost());
    CHECK_FALSE(m.t->linked(b.t->id()));
  }
  CHECK(refused(*b.t, "not_admitted") == 1);
  {
    // The connector refuses an acceptor whose key its own gate does not admit.
    gate_keys own; // admits nobody
    node_side a{security(ka, own)};
    node_side b2{security(kb, gate)};
    REQUIRE(a.t->connect(b2.t->id(), "127.0.0.1", b2.t->port(), b2.t->issue(a.t->id())));
    auto why = a.in->lost();
    REQUIRE(why);
    CHECK(why->second.find("not admitted") != std::string::npos);
    CHECK(refused(*a.t, "not_admitted") == 1);
  }
  {
    // A hello naming an admitted node's key, from someone who cannot sign with it.
    starling::testing::raw_socket c(port);
    auto token = token_of(b.t->issue("mallory"));
    link_handshake hs{mallory, experiment, token};
    uint8_t pre[link_preamble_bytes];
    write_sealed_preamble(token, pre);
    c.write(pre, sizeof pre);
    auto hello = hs.hello();
    std::memcpy(hello.data() + 8, ka.public_key().data(), 32);
    c.write(hello.data(), hello.size());
    uint8_t reply[link_reply_bytes];
    read_exact(c, reply, sizeof reply);
    std::array<uint8_t, link_finish_bytes> fin{};
    auto own = hs.finish(); // a valid head, mallory's signature of another transcript
    std::memcpy(fin.data(), own.data(), fin.size());
    c.write(fin.data(), fin.size());
    CHECK(c.closed_by_peer());
  }
  CHECK(refused(*b.t, "signature") == 1);
  {
    // Plaintext links are refused by a closed run's transport.
    starling::testing::raw_socket c(port);
    uint8_t pre[link_preamble_bytes];
    write_link_preamble(token_of(b.t->issue("mallory")), pre);
    c.write(pre, sizeof pre);
    CHECK(c.closed_by_peer());
  }
  CHECK(refused(*b.t, "plaintext") == 1);
  {
    // Garbage where the hello belongs.
    starling::testing::raw_socket c(port);
    uint8_t pre[link_preamble_bytes];
    write_sealed_preamble(token_of(b.t->issue("mallory")), pre);
    c.write(pre, sizeof pre);
    std::vector<uint8_t> junk(link_hello_bytes, 0xab);
    c.write(junk.data(), junk.size());
    CHECK(c.closed_by_peer());
  }
  CHECK(refused(*b.t, "handshake") == 1);
  {
    // An open run's transport (plaintext) cannot link to a closed run's, nor the other way.
    node_side open{nullptr};
    CHECK_FALSE(open.t->sealed());
    REQUIRE(open.t->connect(b.t->id(), "127.0.0.1", port, b.t->issue(open.t->id())));
    REQUIRE(open.in->lost());
    node_side a{security(ka, gate)};
    REQUIRE(a.t->connect(open.t->id(), "127.0.0.1", open.t->port(),
                         open.t->issue(a.t->id())));
    REQUIRE(a.in->lost());
  }
  CHECK(refused(*b.t, "plaintext") == 2);
  CHECK(b.t->delivered() == 0);
}

TEST_CASE("sealed link: a tampered, replayed or malformed record closes the link with a counted "
          "reason") {
  auto ka = auth::key_pair::from_test_seed(31);
  auto kb = auth::key_pair::from_test_seed(32);
  gate_keys gate;
  gate.admit(ka);
  gate.admit(kb);
  node_side b{security(kb, gate)};
  auto port = b.t->port();
  auto next = [&] { return token_of(b.t->issue("a")); };
  {
    raw_sealed c(port, ka, next());
    auto r = c.record(bare_frame(b.channel, 1));
    c.c.write(r.data(), r.size());
    auto f = b.in->next();
    REQUIRE(f);
    CHECK(f->body == std::vector<uint8_t>{1});
    // A flipped bit in the next record's ciphertext.
    auto t = c.record(bare_frame(b.channel, 2));
    t[sealed_header_bytes + 3] ^= 0x10;
    c.c.write(t.data(), t.size());
    CHECK(c.c.closed_by_peer());
  }
  CHECK(refused(*b.t, "tampered") == 1);
  {
    raw_sealed c(port, ka, next());
    auto r = c.record(bare_frame(b.channel, 3));
    c.c.write(r.data(), r.size());
    REQUIRE(b.in->next());
    c.c.write(r.data(), r.size()); // the same record again
    CHECK(c.c.closed_by_peer());
  }
  CHECK(refused(*b.t, "tampered") == 2);
  {
    raw_sealed c(port, ka, next());
    auto r0 = c.record(bare_frame(b.channel, 4));
    auto r1 = c.record(bare_frame(b.channel, 5));
    c.c.write(r1.data(), r1.size()); // out of order
    c.c.write(r0.data(), r0.size());
    CHECK(c.c.closed_by_peer());
  }
  CHECK(refused(*b.t, "tampered") == 3);
  {
    raw_sealed c(port, ka, next());
    uint8_t h[sealed_header_bytes];
    write_sealed_header(sealed_max_record + 1, h);
    c.c.write(h, sizeof h);
    CHECK(c.c.closed_by_peer());
  }
  CHECK(refused(*b.t, "record") == 1);
  CHECK(b.t->delivered() == 2);
  CHECK(b.t->last_error().find("record") != std::string::npos);
}

} // namespace starling::test::actors_sealed_link_test
