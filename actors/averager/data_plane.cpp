#include "actors/averager/data_plane.hpp"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <algorithm>
#include <map>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <sodium.h>

#include "actors/transfer/socket_io.hpp"
#include "messages/averager.hpp"
#include "messages/chunked.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::actors::averager {

using clk = std::chrono::steady_clock;
using transfer::buffer_pool;
using transfer::recv_all;
using transfer::send_all;

// -- plane_chunk -------------------------------------------------------------------------------

plane_chunk::plane_chunk(plane_meta meta, at::Tensor values, kernels::codec_id codec,
                         kernels::codec_params params)
  : meta_(std::move(meta)), values_(std::move(values)), codec_(codec), params_(params) {}

plane_chunk::~plane_chunk() = default;

const status& plane_chunk::encode() {
  std::call_once(once_, [this] {
    auto meta = encode_plane_meta(meta_);
    if (!meta) {
      status_ = meta.error();
      return;
    }
    meta_bytes_ = std::move(*meta);
    if (!values_.defined())
      return;
    auto src = messages::encode_tensor_source({values_, codec_, params_, {}});
    if (!src && codec_ != kernels::codec_id::none)
      src = messages::encode_tensor_source({values_, kernels::codec_id::none, {}, {}});
    if (!src) {
      status_ = src.error();
      return;
    }
    payload_ = std::move(*src);
    values_ = at::Tensor{}; // a referencing payload keeps what it needs alive
  });
  return status_;
}

namespace {

/// Socket send buffer of an outgoing link.
constexpr int send_buffer = 4 << 20;

struct token_entry {
  std::string peer;
  clk::time_point deadline;
};

/// An outgoing link: a writer thread draining a queue of chunks.
struct out_link {
  std::string peer;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<plane_chunk>> queue;
  bool dead = false;
  bool stopping = false;
  int fd = -1;
  std::thread thread;
};

/// Received chunks of one incoming link that the sink still holds. The reader takes no new
/// buffer while `limit` are out: TCP's flow control then slows the sender, instead of chunks
/// piling up in the averager's mailbox (a 4-peer 16M-float round had 12 x 4 MiB queued).
struct link_credit {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t out = 0;
  bool stopping = false;

  /// Waits for a free slot and takes it; false once the plane stops.
  bool acquire(uint32_t limit) {
    std::unique_lock<std::mutex> lock{mu};
    cv.wait(lock, [&] { return out < limit || stopping; });
    if (stopping)
      return false;
    ++out;
    return true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> guard{mu};
      --out;
    }
    cv.notify_all();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> guard{mu};
      stopping = true;
    }
    cv.notify_all();
  }
};

/// A delivered chunk's tensor and its link's slot, returned (buffer first) when the last copy of
/// the tensor is freed.
struct credit_hold {
  at::Tensor tensor;
  std::shared_ptr<link_credit> credit;
  ~credit_hold() {
    tensor.reset();
    if (credit)
      credit->release();
  }
};

class plane_impl final : public data_plane {
public:
  plane_impl(caf::actor sink, data_plane_options opts, int fd, uint16_t port)
    : sink_(std::move(sink)), opts_(std::move(opts)), listen_fd_(fd), port_(port),
      pool_(std::make_shared<buffer_pool>(opts_.pool_buffers)) {
    host_ = opts_.host == "localhost" ? std::string{"127.0.0.1"} : opts_.host;
    randombytes_buf(&tag_, sizeof tag_);
    acceptor_ = std::make_unique<transfer::acceptor>(
        listen_fd_, opts_.max_links, [this](int fd) { serve_link(fd); },
        [this](std::string why) { record_failure(std::move(why)); });
  }

  ~plane_impl() override { stop(); }

  const std::string& host() const override { return host_; }
  uint16_t port() const override { return port_; }
  uint64_t tag() const override { return tag_; }
  uint64_t delivered() const override { return delivered_; }
  uint64_t failed() const override { return failed_; }
  std::string last_error() const override {
    std::lock_guard<std::mutex> guard{mu_};
    return last_error_;
  }

  std::string issue(const std::string& peer) override {
    plane_token t;
    randombytes_buf(t.data(), t.size());
    std::lock_guard<std::mutex> guard{mu_};
    auto now = clk::now();
    for (auto i = tokens_.begin(); i != tokens_.end();)
      i = i->second.deadline < now ? tokens_.erase(i) : std::next(i);
    tokens_[t] = token_entry{peer, now + opts_.token_ttl};
    return token_to_hex(t);
  }

  status connect(const std::string& peer, const std::string& host, uint16_t port,
                 const std::string& token) override {
    auto t = token_from_hex(token);
    if (!t)
      return t.error();
    if (port == 0)
      return fail("averager data plane: port 0");
    std::shared_ptr<out_link> old;
    auto link = std::make_shared<out_link>();
    link->peer = peer;
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return fail("averager data plane: stopped");
      if (auto i = out_.find(peer); i != out_.end()) {
        std::lock_guard<std::mutex> lg{i->second->mu};
        if (!i->second->dead)
          return {}; // already linked
        old = i->second;
      }
      out_[peer] = link;
    }
    if (old && old->thread.joinable())
      old->thread.join(); // dead: its thread has finished or is about to
    link->thread = std::thread([this, link, host, port, tok = *t] { write_loop(link, host, port, tok); });
    return {};
  }

  bool linked(const std::string& peer) const override {
    std::lock_guard<std::mutex> guard{mu_};
    auto i = out_.find(peer);
    if (i == out_.end())
      return false;
    std::lock_guard<std::mutex> lg{i->second->mu};
    return !i->second->dead;
  }

  bool send(const std::string& peer, std::shared_ptr<plane_chunk> c) override {
    std::shared_ptr<out_link> link;
    {
      std::lock_guard<std::mutex> guard{mu_};
      auto i = out_.find(peer);
      if (i == out_.end())
        return false;
      link = i->second;
    }
    {
      std::lock_guard<std::mutex> lg{link->mu};
      if (link->dead || link->stopping)
        return false;
      link->queue.push_back(std::move(c));
    }
    link->cv.notify_one();
    return true;
  }

  void stop() override {
    std::map<std::string, std::shared_ptr<out_link>> outs;
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      stopped_ = true;
      tokens_.clear();
      outs.swap(out_);
      for (auto& c : credits_) // readers waiting for a slot
        if (auto credit = c.lock())
          credit->stop();
      credits_.clear();
    }
    for (auto& [peer, link] : outs) {
      {
        std::lock_guard<std::mutex> lg{link->mu};
        link->stopping = true;
        link->queue.clear();
        if (link->fd >= 0)
          ::shutdown(link->fd, SHUT_RDWR);
      }
      link->cv.notify_all();
    }
    for (auto& [peer, link] : outs)
      if (link->thread.joinable())
        link->thread.join();
    acceptor_->stop();
  }

private:
  void record_failure(std::string what) {
    std::lock_guard<std::mutex> guard{mu_};
    ++failed_;
    last_error_ = std::move(what);
  }

  // -- sending ----------------------------------------------------------------------------------

  void write_loop(const std::shared_ptr<out_link>& link, std::string host, uint16_t port,
                  plane_token token) {
    auto run = [&]() -> status {
      std::string why;
      int fd = transfer::connect_ipv4(host, port, send_buffer, why, opts_.io_timeout);
      if (fd < 0)
        return fail(why);
      {
        std::lock_guard<std::mutex> lg{link->mu};
        link->fd = fd;
        if (link->stopping)
          return fail("stopped");
      }
      transfer::set_timeouts(fd, opts_.io_timeout);
      uint8_t pre[plane_preamble_bytes];
      write_plane_preamble(token, pre);
      if (auto st = send_all(fd, pre, sizeof pre); !st)
        return st;
      for (;;) {
        std::shared_ptr<plane_chunk> c;
        {
          std::unique_lock<std::mutex> lk{link->mu};
          link->cv.wait(lk, [&] { return link->stopping || !link->queue.empty(); });
          if (link->stopping)
            return fail("stopped");
          c = std::move(link->queue.front());
          link->queue.pop_front();
        }
        if (auto& st = c->encode(); !st)
          return st;
        auto& meta = c->meta_bytes();
        auto& payload = c->payload();
        plane_frame_header h;
        h.meta_bytes = static_cast<uint32_t>(meta.size());
        h.payload_bytes = payload ? payload->size() : 0;
        uint8_t raw[plane_frame_header_bytes];
        write_plane_frame_header(h, raw);
        if (auto st = send_all(fd, raw, sizeof raw, MSG_MORE); !st)
          return st;
        if (auto st = send_all(fd, meta.data(), meta.size(), payload ? MSG_MORE : 0); !st)
          return st;
        if (payload) {
          status sent;
          payload->for_each(0, payload->size(), [&](const char* p, size_t n) -> caf::error {
            sent = send_all(fd, p, n);
            return sent ? caf::error{} : caf::make_error(caf::sec::runtime_error);
          });
          if (!sent)
            return sent;
        }
      }
    };
    auto st = run();
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lg{link->mu};
      stopping = link->stopping;
      link->dead = true;
      link->queue.clear();
      if (link->fd >= 0)
        ::close(link->fd);
      link->fd = -1;
    }
    if (!stopping) {
      auto what = "link to " + link->peer + ": " + st.what();
      record_failure(what);
      caf::anon_send(sink_, avg_plane_atom::value, tag_, link->peer, what);
    }
  }

  // -- receiving --------------------------------------------------------------------------------

  /// One incoming link (on its own thread; the acceptor closes the socket afterwards).
  void serve_link(int fd) {
    auto credit = std::make_shared<link_credit>();
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      // Forget the slots of links that ended, remember this one's for `stop`.
      credits_.erase(std::remove_if(credits_.begin(), credits_.end(),
                                    [](const auto& c) { return c.expired(); }),
                     credits_.end());
      credits_.push_back(credit);
    }
    if (auto st = serve(fd, credit); !st)
      record_failure("incoming link: " + st.what());
  }

  /// Waits until `fd` is readable (or closed); no timeout: links idle between rounds.
  static bool wait_readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    for (;;) {
      auto r = ::poll(&p, 1, -1);
      if (r < 0 && errno == EINTR)
        continue;
      return r > 0;
    }
  }

  /// Reads one link until it closes; fails on anything malformed.
  status serve(int fd, const std::shared_ptr<link_credit>& credit) {
    transfer::set_timeouts(fd, opts_.io_timeout);
    uint8_t pre[plane_preamble_bytes];
    size_t got = 0;
    if (auto st = recv_all(fd, pre, sizeof pre, got); !st)
      return fail("preamble: " + st.what());
    auto token = parse_plane_preamble(pre, sizeof pre);
    if (!token)
      return token.error();
    std::string peer;
    {
      std::lock_guard<std::mutex> guard{mu_};
      auto i = tokens_.find(*token);
      if (i == tokens_.end() || i->second.deadline < clk::now())
        return fail("unknown or expired token");
      peer = std::move(i->second.peer);
      tokens_.erase(i); // one-time
    }
    std::vector<uint8_t> meta_buf;
    for (;;) {
      if (!wait_readable(fd))
        return {};
      uint8_t raw[plane_frame_header_bytes];
      auto r = ::recv(fd, raw, 1, MSG_PEEK);
      if (r == 0)
        return {}; // closed between frames: a clean end
      if (auto st = recv_all(fd, raw, sizeof raw, got); !st)
        return fail("frame header from " + peer + ": " + st.what());
      auto h = parse_plane_frame_header(raw, sizeof raw);
      if (!h)
        return h.error();
      if (h->payload_bytes > opts_.max_payload_bytes)
        return fail("a payload of " + std::to_string(h->payload_bytes) + " bytes from " + peer +
                    " (limit " + std::to_string(opts_.max_payload_bytes) + ")");
      meta_buf.resize(h->meta_bytes);
      if (auto st = recv_all(fd, meta_buf.data(), meta_buf.size(), got); !st)
        return fail("meta from " + peer + ": " + st.what());
      auto meta = decode_plane_meta(meta_buf.data(), meta_buf.size());
      if (!meta)
        return meta.error();
      messages::avg_chunk c;
      c.group_id = meta->group_id;
      c.kind = meta->kind;
      c.part = meta->part;
      c.from = meta->from;
      c.weight = meta->weight;
      c.offset = meta->offset;
      c.contributors = std::move(meta->contributors);
      c.error = std::move(meta->error);
      if (h->payload_bytes > 0) {
        if (!credit->acquire(std::max<uint32_t>(1, opts_.link_buffers)))
          return {}; // stopping
        // The slot returns when the sink drops the chunk's tensor (at once on failure).
        struct slot_guard {
          link_credit* c;
          ~slot_guard() {
            if (c != nullptr)
              c->release();
          }
        } guard{credit.get()};
        auto b = pool_->take(h->payload_bytes);
        if (auto st = recv_all(fd, b.data.get(), h->payload_bytes, got); !st) {
          pool_->give(std::move(b));
          return fail("payload from " + peer + ": " + st.what());
        }
        auto one_dim = [](const kernels::tensor_header& th) -> status {
          if (th.shape.size() != 1)
            return fail("a chunk must be a 1-D tensor");
          return {};
        };
        if (auto st = transfer::decode_pooled(pool_, std::move(b), h->payload_bytes, one_dim,
                                              c.values);
            !st)
          return fail("payload from " + peer + ": " + st.what());
        if (c.values.tensor.defined()) {
          auto hold = std::make_shared<credit_hold>();
          hold->tensor = c.values.tensor;
          hold->credit = credit;
          auto& t = hold->tensor;
          c.values.tensor = at::from_blob(
            t.data_ptr(), t.sizes(), t.strides(), [hold](void*) mutable { hold.reset(); },
            t.options());
          guard.c = nullptr; // the tensor holds the slot now
        }
      } else if (c.error.empty()) {
        return fail("a chunk from " + peer + " without values or error");
      }
      ++delivered_; // first: a sink that got the chunk sees it counted
      caf::anon_send(sink_, avg_plane_atom::value, tag_, peer, std::move(c));
    }
  }

  caf::actor sink_;
  data_plane_options opts_;
  int listen_fd_;
  std::string host_;
  uint16_t port_;
  uint64_t tag_ = 0;
  std::shared_ptr<buffer_pool> pool_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  std::map<plane_token, token_entry> tokens_;
  std::map<std::string, std::shared_ptr<out_link>> out_;
  std::vector<std::weak_ptr<link_credit>> credits_;
  std::unique_ptr<transfer::acceptor> acceptor_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::string last_error_;
};

} // namespace

result<std::shared_ptr<data_plane>> data_plane::open(caf::actor sink, data_plane_options opts) {
  if (!sink)
    return fail("cannot open the averager data plane: no sink");
  if (sodium_init() < 0)
    return fail("cannot open the averager data plane: libsodium failed to initialize");
  uint16_t port = 0;
  std::string why;
  auto host = opts.host == "localhost" ? std::string{"127.0.0.1"} : opts.host;
  int fd = transfer::listen_ipv4(host, opts.port, port, why);
  if (fd < 0)
    return fail("cannot open the averager data plane: " + why);
  return std::shared_ptr<data_plane>{
    std::make_shared<plane_impl>(std::move(sink), std::move(opts), fd, port)};
}

} // namespace starling::actors::averager
