// Tensor transfer between two actor systems of one process over loopback (real BASP over TCP),
// next to a raw TCP transfer of the same bytes in the same run. For 1, 16 and 64 MiB of fp32:
//   raw TCP    one persistent blocking socket pair over 127.0.0.1, a sender and a receiver thread;
//              timed from the first send until the sender read the receiver's 1-byte ack.
//   one msg    a `tensor_msg` request to a remote actor that decodes it and replies (codec none).
//   chunked    actors/transfer/chunked.hpp: 4 MiB chunks, window 4; timed until the sender's
//              reply, which follows the receiver's decode.
//   direct     actors/transfer/data_channel.hpp: announced over BASP, the bytes stream over a
//              loopback TCP data connection (new per transfer), written straight from the
//              tensor's storage and read into a pooled buffer; timed until the sender's reply,
//              which follows the receiver's decode and hand-off to the sink.
//   sealed     `direct` as in a closed run: both endpoints with node keys, the link's handshake
//              proves them and every byte travels in sealed records (link_crypto.hpp; the
//              cipher is printed). Its own link, opened in the warm-up like `direct`'s.
// GB/s = tensor bytes / median time of `reps` runs after one warm-up. Both systems run with
// `middleman.workers=0` (CAF-NOTES, pitfall 7). Unless --default-malloc is given, glibc keeps
// freed memory instead of unmapping it (mallopt), as a buffer pool would: fresh pages fault in
// at ~4 GB/s otherwise, which costs CAF's copies of each chunk more than the socket itself.
//
// Scheduler: `sharing` by default (idle work-stealing workers poll and steal the 2 cores from
// the I/O threads); --stealing uses CAF's default policy.
//
// usage: bench_transfer [--default-malloc] [--stealing] [--chunk-kib N] [--window N] [reps]
//        (default 5 reps; chunk and window default to chunked_options)
#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdexcept>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <torch/torch.h>

#include "actors/auth/identity.hpp"
#include "actors/transfer/chunked.hpp"
#include "actors/transfer/data_channel.hpp"
#include "actors/transfer/link_crypto.hpp"
#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/registry.hpp"
#include "messages/tensor_msg.hpp"

using namespace starling;
using clk = std::chrono::steady_clock;
using messages::tensor_msg;

namespace {

template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clk::now();
    f();
    t.push_back(std::chrono::duration<double>(clk::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void check(bool ok, const char* what) {
  if (!ok)
    throw std::runtime_error(std::string{what} + ": " + std::strerror(errno));
}

// A connected pair of blocking TCP sockets over 127.0.0.1.
struct socket_pair {
  int tx = -1;
  int rx = -1;

  socket_pair() {
    int lst = ::socket(AF_INET, SOCK_STREAM, 0);
    check(lst >= 0, "socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    check(::bind(lst, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
    check(::listen(lst, 1) == 0, "listen");
    socklen_t len = sizeof addr;
    check(::getsockname(lst, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname");
    tx = ::socket(AF_INET, SOCK_STREAM, 0);
    check(tx >= 0, "socket");
    check(::connect(tx, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect");
    rx = ::accept(lst, nullptr, nullptr);
    check(rx >= 0, "accept");
    ::close(lst);
    int one = 1;
    ::setsockopt(tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(rx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  ~socket_pair() {
    ::close(tx);
    ::close(rx);
  }

  // Moves `src` to `dst` (same size) through the sockets; returns when the receiver acked.
  void transfer(const char* src, char* dst, size_t n) {
    std::thread receiver([&] {
      size_t got = 0;
      while (got < n) {
        auto r = ::recv(rx, dst + got, n - got, 0);
        check(r > 0, "recv");
        got += static_cast<size_t>(r);
      }
      char ack = 1;
      check(::send(rx, &ack, 1, 0) == 1, "send ack");
    });
    size_t sent = 0;
    while (sent < n) {
      auto r = ::send(tx, src + sent, n - sent, 0);
      check(r > 0, "send");
      sent += static_cast<size_t>(r);
    }
    char ack = 0;
    check(::recv(tx, &ack, 1, MSG_WAITALL) == 1, "recv ack");
    receiver.join();
  }
};

} // namespace

int main(int argc, char** argv) {
  bool default_malloc = false;
  bool stealing = false;
  int reps = 5;
  actors::transfer::chunked_options copts;
  for (int i = 1; i < argc; ++i) {
    if (std::string{argv[i]} == "--chunk-kib" && i + 1 < argc)
      copts.chunk_bytes = std::max<uint64_t>(1, std::strtoull(argv[++i], nullptr, 10)) << 10;
    else if (std::string{argv[i]} == "--window" && i + 1 < argc)
      copts.window = static_cast<uint32_t>(std::max(1, std::atoi(argv[++i])));
    else if (std::string{argv[i]} == "--default-malloc")
      default_malloc = true;
    else if (std::string{argv[i]} == "--stealing")
      stealing = true;
    else
      reps = std::max(1, std::atoi(argv[i]));
  }
  if (!default_malloc) {
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  torch::set_num_threads(1);

  caf::actor_system_config cfg_a;
  caf::actor_system_config cfg_b;
  for (auto* cfg : {&cfg_a, &cfg_b}) {
    cfg->load<caf::io::middleman>();
    messages::register_types(*cfg);
    cfg->set("middleman.workers", 0);
    cfg->set("scheduler.max-threads", 2);
    if (!stealing)
      cfg->set("scheduler.policy", caf::atom("sharing"));
    cfg->set("logger.verbosity", caf::atom("quiet"));
  }
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};

  // Node b: a decoder for the one-message path, a chunk receiver feeding a sink.
  auto decoder = b.spawn([]() -> caf::behavior {
    return {[](tensor_msg& m) -> uint64_t {
      return m.ok() ? static_cast<uint64_t>(m.tensor.numel()) : 0;
    }};
  });
  auto sink = b.spawn([]() -> caf::behavior { return {[](tensor_msg&) {}}; });
  auto receiver = actors::transfer::spawn_chunk_receiver(b, sink);
  auto endpoint = actors::transfer::data_endpoint::open({});
  if (!endpoint) {
    std::fprintf(stderr, "%s\n", endpoint.error().what.c_str());
    return 1;
  }
  auto direct_rx = actors::transfer::spawn_direct_receiver(b, sink, *endpoint);
  // The sealed pair: b's endpoint and a client-mode one for a, each with its node key; each
  // admits the other's key only.
  namespace auth = actors::auth;
  auto key_a = std::make_shared<const auth::key_pair>(auth::key_pair::generate());
  auto key_b = std::make_shared<const auth::key_pair>(auth::key_pair::generate());
  auto sealing = [](std::shared_ptr<const auth::key_pair> me, std::string peer_id) {
    auto s = std::make_shared<actors::transfer::link_security>();
    s->key = std::move(me);
    s->experiment = "bench-transfer";
    s->admit = [peer_id](const std::string& id) {
      return id == peer_id ? std::string{} : std::string{"not this run's"};
    };
    return s;
  };
  actors::transfer::data_channel_options sealed_rx_opts;
  sealed_rx_opts.security = sealing(key_b, key_a->peer_id());
  auto sealed_ep = actors::transfer::data_endpoint::open(sealed_rx_opts);
  actors::transfer::data_channel_options sealed_tx_opts;
  sealed_tx_opts.host.clear();
  sealed_tx_opts.security = sealing(key_a, key_b->peer_id());
  auto sealed_tx_ep = actors::transfer::data_endpoint::open(sealed_tx_opts);
  if (!sealed_ep || !sealed_tx_ep) {
    std::fprintf(stderr, "sealed endpoints failed\n");
    return 1;
  }
  auto sealed_rx = actors::transfer::spawn_direct_receiver(b, sink, *sealed_ep);
  auto port_d = b.middleman().publish(decoder, 0, "127.0.0.1");
  auto port_r = b.middleman().publish(receiver, 0, "127.0.0.1");
  auto port_x = b.middleman().publish(direct_rx, 0, "127.0.0.1");
  auto port_s = b.middleman().publish(sealed_rx, 0, "127.0.0.1");
  if (!port_d || !port_r || !port_x || !port_s) {
    std::fprintf(stderr, "publish failed\n");
    return 1;
  }
  auto remote_d = a.middleman().remote_actor("127.0.0.1", *port_d);
  auto remote_r = a.middleman().remote_actor("127.0.0.1", *port_r);
  auto remote_x = a.middleman().remote_actor("127.0.0.1", *port_x);
  auto remote_s = a.middleman().remote_actor("127.0.0.1", *port_s);
  if (!remote_d || !remote_r || !remote_x || !remote_s) {
    std::fprintf(stderr, "remote_actor failed\n");
    return 1;
  }
  auto sender = actors::transfer::spawn_chunk_sender(a, copts);
  actors::transfer::direct_sender_options dopts;
  dopts.chunks = copts;
  auto direct_tx = actors::transfer::spawn_direct_sender(a, dopts);
  dopts.endpoint = *sealed_tx_ep;
  auto sealed_tx = actors::transfer::spawn_direct_sender(a, dopts);
  caf::scoped_actor self{a};
  socket_pair sockets;

  std::printf("tensor transfer over loopback, median of %d after a warm-up; malloc: %s; "
              "scheduler: %s\n",
              reps, default_malloc ? "glibc defaults" : "no unmapping (pool-like)",
              stealing ? "stealing" : "sharing");
  std::printf("chunks of %llu KiB, window %u\n",
              static_cast<unsigned long long>(copts.chunk_bytes >> 10), copts.window);
  std::printf("sealed: %s\n",
              actors::transfer::cipher_name((actors::transfer::local_ciphers()
                                             & actors::transfer::cipher_aes256gcm)
                                              ? actors::transfer::cipher_aes256gcm
                                              : actors::transfer::cipher_xchacha20));
  std::printf("%8s %12s %12s %8s %12s %8s %12s %8s %12s %8s %9s\n", "MiB", "raw TCP GB/s",
              "1 msg GB/s", "% raw", "chunked GB/s", "% raw", "direct GB/s", "% raw",
              "sealed GB/s", "% raw", "% direct");
  bool failed = false;
  for (int mib : {1, 16, 64}) {
    size_t bytes = static_cast<size_t>(mib) << 20;
    torch::manual_seed(mib);
    tensor_msg m;
    m.tensor = torch::randn({static_cast<int64_t>(bytes / 4)});
    const char* src = static_cast<const char*>(m.tensor.data_ptr());
    std::vector<char> dst(bytes);
    double raw = median_seconds(reps, [&] { sockets.transfer(src, dst.data(), bytes); });
    double one = median_seconds(reps, [&] {
      self->request(*remote_d, caf::infinite, m)
          .receive([&](uint64_t numel) { failed |= numel != bytes / 4; },
                   [&](caf::error&) { failed = true; });
    });
    double chunked = median_seconds(reps, [&] {
      self->request(sender, caf::infinite, transfer_atom::value, m, *remote_r)
          .receive([&](uint64_t) {}, [&](caf::error&) { failed = true; });
    });
    double direct = median_seconds(reps, [&] {
      self->request(direct_tx, caf::infinite, transfer_atom::value, m, *remote_x)
          .receive([&](messages::transfer_report& r) { failed |= r.path != "direct"; },
                   [&](caf::error&) { failed = true; });
    });
    double sealed = median_seconds(reps, [&] {
      self->request(sealed_tx, caf::infinite, transfer_atom::value, m, *remote_s)
          .receive([&](messages::transfer_report& r) { failed |= r.path != "direct"; },
                   [&](caf::error&) { failed = true; });
    });
    auto gbs = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
    std::printf("%8d %12.2f %12.2f %7.0f%% %12.2f %7.0f%% %12.2f %7.0f%% %12.2f %7.0f%% %8.0f%%\n",
                mib, gbs(raw), gbs(one), 100.0 * raw / one, gbs(chunked), 100.0 * raw / chunked,
                gbs(direct), 100.0 * raw / direct, gbs(sealed), 100.0 * raw / sealed,
                100.0 * direct / sealed);
  }
  if (failed)
    std::printf("some transfers failed\n");
  for (auto& h : {decoder, sink, receiver, sender, direct_rx, direct_tx, sealed_rx, sealed_tx})
    caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  (*endpoint)->stop();
  (*sealed_ep)->stop();
  (*sealed_tx_ep)->stop();
  b.middleman().unpublish(sealed_rx, *port_s);
  b.middleman().unpublish(direct_rx, *port_x);
  b.middleman().unpublish(decoder, *port_d);
  b.middleman().unpublish(receiver, *port_r);
  return failed ? 1 : 0;
}
