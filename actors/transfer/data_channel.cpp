#include "actors/transfer/data_channel.hpp"
#include "actors/transfer/socket_io.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <sodium.h>

#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/wire.hpp"

namespace starling::actors::transfer {

using messages::direct_announce;
using messages::direct_endpoint;
using messages::tensor_msg;
using messages::transfer_report;
using clk = std::chrono::steady_clock;

namespace {

/// Bytes a refusing receiver reads and discards before it closes (see `accept_loop`).
constexpr size_t drain_limit = size_t{1} << 20;
/// Send buffer of a data connection, set before connecting: a fresh connection starts with room
/// for 4 MiB in flight instead of waiting for the kernel's autotuning. (A fixed 4 MiB receive
/// buffer as well made 1 MiB transfers ~4x slower here, so the receiver keeps autotuning.)
constexpr int socket_buffer = 4 << 20;

using token_type = std::array<uint8_t, 16>;

/// An announced transfer waiting for its connection.
struct pending {
  uint64_t total = 0;
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  uint8_t codec = 0;
  uint64_t max_bytes = 0;
  caf::actor sink;
  clk::time_point deadline;
};

/// Checks a payload's header against its announcement.
status matches(const pending& p, const kernels::tensor_header& h) {
  if (static_cast<uint8_t>(h.dtype) != p.dtype || h.shape != p.shape ||
      static_cast<uint8_t>(h.codec) != p.codec)
    return fail("the payload's dtype, shape or codec differs from the announcement");
  return {};
}

class endpoint_impl final : public data_endpoint {
public:
  endpoint_impl(data_channel_options opts, int fd, std::string host, uint16_t port)
    : opts_(std::move(opts)), listen_fd_(fd), host_(std::move(host)), port_(port),
      pool_(std::make_shared<buffer_pool>(opts_.pool_buffers)) {
    acceptor_ = std::make_unique<acceptor>(
        listen_fd_, opts_.max_connections, [this](int fd) { serve_connection(fd); },
        [this](std::string why) { record_failure(std::move(why)); });
  }

  ~endpoint_impl() override { stop(); }

  const std::string& host() const override { return host_; }
  uint16_t port() const override { return port_; }
  uint64_t delivered() const override { return delivered_; }
  uint64_t failed() const override { return failed_; }
  std::string last_error() const override {
    std::lock_guard<std::mutex> guard{mu_};
    return last_error_;
  }

  /// Remembers an announcement; fails on a duplicate token or after `stop`.
  status expect(const token_type& token, pending p) {
    std::lock_guard<std::mutex> guard{mu_};
    if (stopped_)
      return fail("the data endpoint is stopped");
    purge_expired(clk::now());
    p.deadline = clk::now() + opts_.announce_ttl;
    if (!expected_.emplace(token, std::move(p)).second)
      return fail("a transfer with this token is already announced");
    return {};
  }

  void stop() override {
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      stopped_ = true;
      expected_.clear();
    }
    acceptor_->stop();
  }

private:

  void purge_expired(clk::time_point now) {
    for (auto i = expected_.begin(); i != expected_.end();)
      i = i->second.deadline < now ? expected_.erase(i) : std::next(i);
  }

  void record_failure(std::string what) {
    std::lock_guard<std::mutex> guard{mu_};
    ++failed_;
    last_error_ = std::move(what);
  }

  /// One connection (on its own thread; the acceptor closes the socket afterwards).
  void serve_connection(int fd) {
    if (serve(fd))
      return;
    // Refused or failed: stop writing, then discard what the sender still has in flight
    // (bounded) so that closing does not reset the connection before the sender read the status.
    ::shutdown(fd, SHUT_WR);
    std::vector<char> discard(size_t{1} << 16);
    size_t drained = 0;
    while (drained < drain_limit) {
      auto r = ::recv(fd, discard.data(), discard.size(), 0);
      if (r <= 0)
        break;
      drained += static_cast<size_t>(r);
    }
  }

  /// Writes the status frame (best effort: the sender may be gone).
  void answer(int fd, const std::string& error) {
    auto n = static_cast<uint32_t>(std::min<size_t>(error.size(), max_status_bytes));
    uint8_t len[4];
    write_le(len, n, 4);
    if (send_all(fd, len, 4, n ? MSG_MORE : 0))
      (void) send_all(fd, error.data(), n);
  }

  /// Serves one connection; false when the transfer failed (the status says why).
  bool serve(int fd) {
    set_timeouts(fd, opts_.io_timeout);
    auto failed = [&](std::string what) {
      what = "data channel: " + what;
      answer(fd, what);
      record_failure(std::move(what));
      return false;
    };
    uint8_t raw[frame_header_bytes];
    size_t got = 0;
    if (auto st = recv_all(fd, raw, sizeof raw, got); !st)
      return failed("frame header: " + st.what());
    auto h = parse_frame_header(raw, sizeof raw);
    if (!h)
      return failed(h.error().what);
    pending p;
    bool known = false;
    {
      std::lock_guard<std::mutex> guard{mu_};
      purge_expired(clk::now());
      if (auto i = expected_.find(h->token); i != expected_.end()) {
        p = std::move(i->second);
        expected_.erase(i); // one-time, whatever happens next
        known = true;
      }
    }
    if (!known)
      return failed("unknown or expired token");
    if (h->length != p.total)
      return failed("the frame declares " + std::to_string(h->length) +
                    " bytes, the announcement " + std::to_string(p.total));
    if (h->length > p.max_bytes)
      return failed("the frame declares " + std::to_string(h->length) +
                    " bytes, more than the limit of " + std::to_string(p.max_bytes));
    auto b = pool_->take(h->length);
    if (auto st = recv_all(fd, b.data.get(), h->length, got); !st) {
      pool_->give(std::move(b));
      return failed("payload: " + st.what());
    }
    tensor_msg x;
    auto check = [&p](const kernels::tensor_header& header) { return matches(p, header); };
    if (auto st = decode_pooled(pool_, std::move(b), h->length, check, x); !st)
      return failed("decode: " + st.what());
    ++delivered_; // first: a sink that got the tensor sees it counted
    caf::anon_send(p.sink, std::move(x));
    answer(fd, {});
    return true;
  }

  data_channel_options opts_;
  int listen_fd_;
  std::string host_;
  uint16_t port_;
  std::shared_ptr<buffer_pool> pool_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  std::map<token_type, pending> expected_;
  std::unique_ptr<acceptor> acceptor_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::string last_error_;
};

caf::error transfer_error(std::string what) {
  return caf::make_error(caf::sec::runtime_error, "direct transfer: " + std::move(what));
}

/// What a streamer is asked to do: write `source` with `token` to `host:port`.
struct stream_job {
  std::string host;
  uint16_t port = 0;
  token_type token{};
  std::shared_ptr<const messages::chunk_source> source;
  std::chrono::milliseconds io_timeout{};
};

/// Streams one payload and waits for the receiver's status. Connection failures come back as
/// `sec::cannot_connect_to_node` (the sender falls back to chunks), all others as errors.
caf::expected<uint64_t> stream(const stream_job& job) {
  std::string why;
  int fd = connect_ipv4(job.host, job.port, socket_buffer, why);
  if (fd < 0)
    return caf::make_error(caf::sec::cannot_connect_to_node, why);
  set_timeouts(fd, job.io_timeout);
  auto total = job.source->size();
  auto run = [&]() -> status {
    frame_header h;
    h.token = job.token;
    h.length = total;
    uint8_t raw[frame_header_bytes];
    write_frame_header(h, raw);
    if (auto st = send_all(fd, raw, sizeof raw, MSG_MORE); !st)
      return st;
    status sent;
    job.source->for_each(0, total, [&](const char* p, size_t n) -> caf::error {
      sent = send_all(fd, p, n);
      return sent ? caf::error{} : caf::make_error(caf::sec::runtime_error);
    });
    if (!sent) {
      // The receiver may have refused the transfer and closed: its status may still be here.
      uint8_t len[4];
      if (::recv(fd, len, 4, MSG_DONTWAIT | MSG_PEEK) == 4) {
        auto n = std::min<uint32_t>(static_cast<uint32_t>(read_le(len, 4)), max_status_bytes);
        std::string text(4 + n, '\0');
        auto r = ::recv(fd, text.data(), text.size(), MSG_DONTWAIT);
        if (r > 4)
          return fail("the receiver reports: " + text.substr(4, static_cast<size_t>(r) - 4));
      }
      return fail(sent.what());
    }
    uint8_t len[4];
    size_t got = 0;
    if (auto st = recv_all(fd, len, 4, got); !st)
      return fail("no status from the receiver: " + st.what());
    auto n = static_cast<uint32_t>(read_le(len, 4));
    if (n == 0)
      return {};
    if (n > max_status_bytes)
      return fail("the receiver's status is " + std::to_string(n) + " bytes long");
    std::string text(n, '\0');
    if (auto st = recv_all(fd, text.data(), n, got); !st)
      return fail("truncated status from the receiver: " + st.what());
    return fail("the receiver reports: " + text);
  };
  auto st = run();
  ::close(fd);
  if (!st)
    return transfer_error(st.what());
  return total;
}

struct sender_state {
  caf::actor chunks;
  static inline const char* name = "direct_sender";
};

caf::behavior direct_sender(caf::stateful_actor<sender_state>* self, direct_sender_options opts) {
  self->state.chunks = spawn_chunk_sender(self->system(), opts.chunks);
  self->link_to(self->state.chunks);
  return {
    [self, opts](transfer_atom, tensor_msg& x,
                 caf::actor receiver) -> caf::result<transfer_report> {
      if (!receiver)
        return transfer_error("no receiver");
      auto header = kernels::make_header(x.tensor, x.codec, x.params);
      if (!header)
        return transfer_error(header.error().what);
      auto source = messages::encode_tensor_source(x);
      if (!source)
        return transfer_error(source.error().what);
      auto job = std::make_shared<stream_job>();
      job->source = std::move(*source);
      job->io_timeout = opts.io_timeout;
      randombytes_buf(job->token.data(), job->token.size());
      direct_announce a;
      a.token.assign(job->token.begin(), job->token.end());
      a.total_bytes = job->source->size();
      a.dtype = static_cast<uint8_t>(header->dtype);
      a.shape = header->shape;
      a.codec = static_cast<uint8_t>(header->codec);
      auto rp = self->make_response_promise<transfer_report>();
      auto fallback = [self, x, receiver, rp](std::string why) mutable {
        self->request(self->state.chunks, caf::infinite, transfer_atom::value, x, receiver)
          .then(
            [rp, why](uint64_t bytes) mutable {
              rp.deliver(transfer_report{bytes, "chunked", why});
            },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      };
      self->request(receiver, opts.announce_timeout, std::move(a))
        .then(
          [self, job, rp, fallback](direct_endpoint& ep) mutable {
            if (!ep.wire_error.empty()) {
              rp.deliver(transfer_error("the receiver's answer was refused: " + ep.wire_error));
              return;
            }
            if (ep.port == 0)
              return fallback("the receiver has no data endpoint");
            if (auto st = check_loopback(ep.host); !st) {
              rp.deliver(transfer_error("refusing the receiver's data endpoint: " + st.what()));
              return;
            }
            job->host = ep.host;
            job->port = ep.port;
            // The blocking stream runs on its own thread (a detached actor), never on a
            // scheduler worker; the actor system waits for it on shutdown.
            auto streamer = self->spawn<caf::detached>(
              [job](caf::event_based_actor* s) -> caf::behavior {
                return {[s, job](transfer_atom) -> caf::result<uint64_t> {
                  auto r = stream(*job);
                  s->quit();
                  if (!r)
                    return std::move(r.error());
                  return *r;
                }};
              });
            self->request(streamer, caf::infinite, transfer_atom::value)
              .then(
                [rp](uint64_t bytes) mutable { rp.deliver(transfer_report{bytes, "direct", {}}); },
                [self, rp, fallback](caf::error& e) mutable {
                  if (e == caf::sec::cannot_connect_to_node)
                    return fallback("cannot connect to the data endpoint: " +
                                    self->system().render(e));
                  rp.deliver(std::move(e));
                });
          },
          [rp, fallback](caf::error& e) mutable {
            // A plain chunk receiver does not know the announcement.
            if (e == caf::sec::unexpected_message)
              return fallback("the receiver does not take direct transfers");
            rp.deliver(std::move(e));
          });
      return rp;
    },
  };
}

} // namespace

result<std::shared_ptr<data_endpoint>> data_endpoint::open(const data_channel_options& opts) {
  if (auto st = check_loopback(opts.host); !st)
    return fail("cannot open a data endpoint: " + st.what());
  if (sodium_init() < 0)
    return fail("cannot open a data endpoint: libsodium failed to initialize");
  auto text = opts.host == "localhost" ? std::string{"127.0.0.1"} : opts.host;
  uint16_t port = 0;
  std::string why;
  int fd = listen_ipv4(text, opts.port, port, why);
  if (fd < 0)
    return fail("cannot open a data endpoint: " + why);
  return std::shared_ptr<data_endpoint>{
    std::make_shared<endpoint_impl>(opts, fd, text, port)};
}

caf::actor spawn_direct_receiver(caf::actor_system& sys, caf::actor sink,
                                 std::shared_ptr<data_endpoint> endpoint,
                                 receiver_options opts) {
  auto ep = std::static_pointer_cast<endpoint_impl>(std::move(endpoint));
  return sys.spawn([sink, ep, opts](caf::event_based_actor* self) -> caf::behavior {
    caf::message_handler announcements{
      [sink, ep, opts](direct_announce& a) -> caf::result<direct_endpoint> {
        // An announcement whose envelope was refused (counted by the wire context): the reason.
        if (!a.wire_error.empty())
          return caf::make_error(caf::sec::invalid_argument, "direct transfer: " + a.wire_error);
        if (!ep)
          return direct_endpoint{};
        if (a.token.size() != token_type{}.size())
          return caf::make_error(caf::sec::invalid_argument,
                                 "direct transfer: a token of " + std::to_string(a.token.size()) +
                                   " bytes, expected 16");
        if (a.total_bytes == 0 || a.total_bytes > opts.max_bytes)
          return caf::make_error(caf::sec::invalid_argument,
                                 "direct transfer: refused " + std::to_string(a.total_bytes) +
                                   " bytes (limit " + std::to_string(opts.max_bytes) + ")");
        token_type token;
        std::memcpy(token.data(), a.token.data(), token.size());
        pending p;
        p.total = a.total_bytes;
        p.dtype = a.dtype;
        p.shape = std::move(a.shape);
        p.codec = a.codec;
        p.max_bytes = opts.max_bytes;
        p.sink = sink;
        if (auto st = ep->expect(token, std::move(p)); !st)
          return caf::make_error(caf::sec::runtime_error, "direct transfer: " + st.what());
        return direct_endpoint{ep->host(), ep->port()};
      },
      [ep](get_atom) {
        return ep ? direct_endpoint{ep->host(), ep->port()} : direct_endpoint{};
      },
    };
    return announcements.or_else(chunk_receiver_behavior(self, sink, opts));
  });
}

caf::actor spawn_direct_sender(caf::actor_system& sys, direct_sender_options opts) {
  return sys.spawn(direct_sender, opts);
}

} // namespace starling::actors::transfer
