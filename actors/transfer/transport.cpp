#include "actors/transfer/transport.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <utility>

#include <ATen/ATen.h>
#include <sodium.h>

#include "actors/auth/identity.hpp"
#include "actors/transfer/link_crypto.hpp"
#include "actors/transfer/shm_ring.hpp"
#include "actors/transfer/socket_io.hpp"
#include "messages/chunked.hpp"

namespace starling::actors::transfer {

using clk = std::chrono::steady_clock;

// -- outgoing payloads and frames --------------------------------------------------------------

outgoing_payload::outgoing_payload(at::Tensor values, kernels::codec_id codec,
                                   kernels::codec_params params)
  : values_(std::move(values)), codec_(codec), params_(params) {}

outgoing_payload::outgoing_payload(std::shared_ptr<const messages::chunk_source> encoded)
  : codec_(kernels::codec_id::none), bytes_(std::move(encoded)) {}

outgoing_payload::~outgoing_payload() = default;

const status& outgoing_payload::encode() {
  std::call_once(once_, [this] {
    if (bytes_ || !values_.defined())
      return;
    auto src = messages::encode_tensor_source({values_, codec_, params_, {}});
    if (!src && codec_ != kernels::codec_id::none)
      src = messages::encode_tensor_source({values_, kernels::codec_id::none, {}, {}});
    if (!src) {
      status_ = src.error();
      return;
    }
    bytes_ = std::move(*src);
    values_ = at::Tensor{}; // a referencing payload keeps what it needs alive
  });
  return status_;
}

outgoing_frame::outgoing_frame(uint32_t channel, const std::vector<uint8_t>& body,
                               std::shared_ptr<outgoing_payload> payload)
  : meta_(make_link_meta(channel, body)), payload_(std::move(payload)) {}

outgoing_frame::outgoing_frame(uint32_t channel, const std::vector<uint8_t>& body,
                               at::Tensor values, kernels::codec_id codec,
                               kernels::codec_params params)
  : meta_(make_link_meta(channel, body)),
    payload_(values.defined()
               ? std::make_shared<outgoing_payload>(std::move(values), codec, params)
               : nullptr) {}

// -- channel_handler defaults ------------------------------------------------------------------

status channel_handler::admit(const std::string&, const uint8_t*, size_t, uint64_t) {
  return {};
}

status channel_handler::check(const std::string&, const uint8_t*, size_t,
                              const kernels::tensor_header&) {
  return {};
}

bool channel_handler::refused(const std::string&, const uint8_t*, size_t, const std::string&) {
  return false;
}

void channel_handler::link_up(const std::string&) {}

void channel_handler::link_lost(const std::string&, const std::string&) {}

namespace {

/// Socket send buffer of a link this side opens: room for 4 MiB in flight at once instead of
/// waiting for the kernel's autotuning.
constexpr int send_buffer = 4 << 20;

/// How long a writer waits for the peer's handlers to release ring space when they hold every
/// payload it wrote (on 2 cores a busy handler may not run for some milliseconds) before it
/// sends on the socket.
constexpr std::chrono::milliseconds ring_grace{20};

struct token_entry {
  std::string peer;
  clk::time_point deadline;
};

/// Received payloads of one link that its handlers still hold. The reader takes no new buffer
/// while `limit` are out: TCP's flow control then slows the sender, instead of payloads piling
/// up in an actor's mailbox (a 4-peer 16M-float round had 12 x 4 MiB queued).
struct link_credit {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t out = 0;
  bool stopping = false;

  /// Waits for a free slot and takes it; false once the link or the transport stops.
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

/// A delivered payload's tensor and its link's slot, returned (buffer first) when the last copy
/// of the tensor is freed.
struct credit_hold {
  at::Tensor tensor;
  std::shared_ptr<link_credit> credit;
  ~credit_hold() {
    tensor.reset();
    if (credit)
      credit->release();
  }
};

/// Counts a sealed link's refusal by reason (the transport's `refusals`).
using count_fn = std::function<void(const char* reason)>;

/// The sending half of a link's byte stream: straight to the socket (open runs: the same calls
/// as before sealing existed), or in sealed records of at most `sealed_max_record` bytes. Owned
/// by the link's writer thread.
class link_out {
public:
  link_out(int fd, std::unique_ptr<record_cipher> cipher) : fd_(fd), cipher_(std::move(cipher)) {
    if (cipher_)
      buf_.reset(new uint8_t[sealed_max_record + sealed_header_bytes + sealed_tag_bytes]);
  }

  /// Writes `n` bytes (sealed: staged until a record is full or `flush`).
  status write(const void* data, size_t n, int flags = 0) {
    if (!cipher_)
      return send_all(fd_, data, n, flags);
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      if (n >= direct_min) {
        // Bulk bytes (a payload) in records of their own, sealed straight from the source: no
        // staging copy here, and the reader opens them in place in its receive buffer.
        if (auto st = flush(); !st)
          return st;
        auto take = std::min<size_t>(n, sealed_max_record);
        cipher_->seal(p, take, buf_.get());
        if (auto st = send_all(fd_, buf_.get(), take + overhead); !st)
          return st;
        p += take;
        n -= take;
        continue;
      }
      auto take = std::min<size_t>(n, sealed_max_record - staged_);
      std::memcpy(buf_.get() + sealed_header_bytes + staged_, p, take);
      staged_ += take;
      p += take;
      n -= take;
      if (staged_ == sealed_max_record)
        if (auto st = flush(); !st)
          return st;
    }
    return {};
  }

  /// Seals and sends what is staged (the end of a frame).
  status flush() {
    if (!cipher_ || staged_ == 0)
      return {};
    cipher_->seal(buf_.get() + sealed_header_bytes, staged_, buf_.get());
    auto n = staged_ + overhead;
    staged_ = 0;
    return send_all(fd_, buf_.get(), n);
  }

private:
  static constexpr size_t overhead = sealed_header_bytes + sealed_tag_bytes;
  /// Writes of at least this many bytes get records of their own.
  static constexpr size_t direct_min = size_t{64} << 10;
  int fd_;
  std::unique_ptr<record_cipher> cipher_;
  std::unique_ptr<uint8_t[]> buf_;
  size_t staged_ = 0;
};

/// The receiving half: straight from the socket, or record by record, each opened (checked)
/// before a byte of it is used. A record that fits the caller's room is read and opened in
/// place there; a smaller read is served from one record's buffer. Owned by the reader thread.
class link_in {
public:
  link_in(int fd, std::unique_ptr<record_cipher> cipher, count_fn count)
    : fd_(fd), cipher_(std::move(cipher)), count_(std::move(count)) {}

  int fd() const { return fd_; }

  /// True when opened bytes wait here (the socket need not be readable).
  bool buffered() const { return pos_ < end_; }

  /// Reads exactly `n` bytes.
  status read(void* data, size_t n) {
    size_t got = 0;
    if (!cipher_)
      return recv_all(fd_, data, n, got);
    auto* p = static_cast<uint8_t*>(data);
    while (n > 0) {
      if (pos_ < end_) {
        auto take = std::min(n, end_ - pos_);
        std::memcpy(p, buf_.data() + pos_, take);
        pos_ += take;
        p += take;
        n -= take;
        continue;
      }
      uint8_t head[sealed_header_bytes];
      if (auto st = recv_all(fd_, head, sizeof head, got); !st)
        return fail("sealed record header: " + st.what());
      auto len = parse_sealed_header(head, sizeof head);
      if (!len) {
        count_("record");
        return len.error();
      }
      uint8_t* into = p;
      if (n < *len) {
        if (buf_.size() < *len)
          buf_.resize(sealed_max_record);
        into = buf_.data();
      }
      uint8_t tag[sealed_tag_bytes];
      if (auto st = recv_all(fd_, into, *len, got); !st)
        return fail("sealed record: " + st.what());
      if (auto st = recv_all(fd_, tag, sizeof tag, got); !st)
        return fail("sealed record tag: " + st.what());
      if (auto st = cipher_->open(head, into, *len, tag); !st) {
        count_("tampered");
        return st;
      }
      if (into == p) {
        p += *len;
        n -= *len;
      } else {
        pos_ = 0;
        end_ = *len;
      }
    }
    return {};
  }

private:
  int fd_;
  std::unique_ptr<record_cipher> cipher_;
  count_fn count_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

/// One TCP connection to a peer transport, both directions.
struct link {
  std::string peer;
  /// This side connected (its writer thread owns the link and joins its reader).
  bool outgoing = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<outgoing_frame>> queue;
  int fd = -1;
  bool dead = false;
  bool stopping = false;
  /// Set by the owner thread as its last act: the link can be reaped.
  std::atomic<bool> finished{false};
  std::string why;
  std::thread writer;
  std::thread reader;
  std::shared_ptr<link_credit> credit = std::make_shared<link_credit>();
  /// The two halves of the byte stream (set once the link is up).
  std::unique_ptr<link_out> out;
  std::unique_ptr<link_in> in;
  /// The peer's proven node key (sealed links).
  std::string peer_key;
  /// Same-host links: the ring this side writes payloads into, the peer's it reads them from.
  std::unique_ptr<ring_writer> ring_out;
  std::shared_ptr<ring_reader> ring_in;
  /// Over the same-host Unix socket (set once the link is up).
  std::atomic<bool> local{false};
};

class transport_impl final : public transport {
public:
  transport_impl(transport_options opts, int fd, uint16_t port, int local_fd)
    : opts_(std::move(opts)), port_(port), pool_(std::make_shared<buffer_pool>(opts_.pool_buffers)) {
    if (fd >= 0) {
      host_ = opts_.host == "localhost" ? std::string{"127.0.0.1"} : opts_.host;
      id_ = host_ + ":" + std::to_string(port_);
      acceptor_ = std::make_unique<acceptor>(
        fd, opts_.max_links, [this](int c) { serve(c, false); },
        [this](std::string why) { record_failure(std::move(why)); });
      if (local_fd >= 0)
        local_acceptor_ = std::make_unique<acceptor>(
          local_fd, opts_.max_links, [this](int c) { serve(c, true); },
          [this](std::string why) { record_failure(std::move(why)); });
    } else {
      link_token t;
      randombytes_buf(t.data(), t.size());
      id_ = "client-" + token_to_hex(t);
    }
  }

  ~transport_impl() override { stop(); }

  const std::string& id() const override { return id_; }
  const std::string& host() const override { return host_; }
  uint16_t port() const override { return port_; }
  uint64_t delivered() const override { return delivered_; }
  uint64_t failed() const override { return failed_; }
  uint64_t connections_opened() const override { return connections_; }
  uint64_t local_links_opened() const override { return local_links_; }
  bool sealed() const override { return opts_.security != nullptr; }
  std::string congestion_control() const override { return opts_.congestion_control; }
  std::map<std::string, uint64_t> refusals() const override {
    std::lock_guard<std::mutex> guard{mu_};
    return refusals_;
  }
  std::string last_error() const override {
    std::lock_guard<std::mutex> guard{mu_};
    return last_error_;
  }
  /// Sets `last_error` without counting a failure (a setting the kernel refused at open).
  void note(std::string what) {
    std::lock_guard<std::mutex> guard{mu_};
    last_error_ = std::move(what);
  }

  std::string issue(const std::string& peer) override {
    link_token t;
    randombytes_buf(t.data(), t.size());
    std::lock_guard<std::mutex> guard{mu_};
    purge_tokens();
    tokens_[t] = token_entry{peer, clk::now() + opts_.token_ttl};
    return token_to_hex(t);
  }

  status accept(const link_token& token, const std::string& peer) override {
    std::lock_guard<std::mutex> guard{mu_};
    if (stopped_)
      return fail("direct transport: stopped");
    purge_tokens();
    if (!tokens_.emplace(token, token_entry{peer, clk::now() + opts_.token_ttl}).second)
      return fail("direct transport: this token is already expected");
    return {};
  }

  status connect(const std::string& peer, const std::string& host, uint16_t port,
                 const std::string& token) override {
    auto t = token_from_hex(token);
    if (!t)
      return t.error();
    if (port == 0)
      return fail("direct transport: port 0");
    if (auto st = check_ipv4(host); !st)
      return fail("direct transport: " + st.what());
    std::vector<std::shared_ptr<link>> reaped;
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return fail("direct transport: stopped");
      reaped = reap();
      for (auto& l : links_)
        if (l->peer == peer && alive(*l))
          return {}; // pooled
      auto l = std::make_shared<link>();
      l->peer = peer;
      l->outgoing = true;
      links_.push_back(l);
      fit_pool();
      l->writer = std::thread([this, l, host, port, tok = *t] { run_outgoing(l, host, port, tok); });
    }
    join_all(reaped);
    return {};
  }

  link_stats written(const std::string& peer) const override {
    std::lock_guard<std::mutex> guard{stats_mu_};
    auto i = written_.find(peer);
    return i == written_.end() ? link_stats{} : i->second;
  }

  bool linked(const std::string& peer) const override {
    std::lock_guard<std::mutex> guard{mu_};
    for (auto& l : links_)
      if (l->peer == peer && alive(*l))
        return true;
    return false;
  }

  bool local_link(const std::string& peer) const override {
    std::lock_guard<std::mutex> guard{mu_};
    for (auto& l : links_)
      if (l->peer == peer && alive(*l) && l->local.load())
        return true;
    return false;
  }

  bool send(const std::string& peer, std::shared_ptr<outgoing_frame> f) override {
    std::shared_ptr<link> target;
    {
      std::lock_guard<std::mutex> guard{mu_};
      for (auto& l : links_)
        if (l->peer == peer && alive(*l)) {
          target = l;
          break;
        }
    }
    if (!target)
      return false;
    {
      std::lock_guard<std::mutex> lg{target->mu};
      if (target->dead || target->stopping)
        return false;
      target->queue.push_back(std::move(f));
    }
    target->cv.notify_one();
    return true;
  }

  uint32_t add_channel(std::shared_ptr<channel_handler> h) override {
    std::lock_guard<std::mutex> guard{mu_};
    auto id = next_channel_++;
    channels_[id] = std::move(h);
    return id;
  }

  void set_channel(uint32_t id, std::shared_ptr<channel_handler> h) override {
    std::lock_guard<std::mutex> guard{mu_};
    channels_[id] = std::move(h);
  }

  void remove_channel(uint32_t id) override {
    std::lock_guard<std::mutex> guard{mu_};
    channels_.erase(id);
  }

  void stop() override {
    std::vector<std::shared_ptr<link>> links;
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      stopped_ = true;
      tokens_.clear();
      links.swap(links_);
    }
    for (auto& l : links) {
      {
        std::lock_guard<std::mutex> lg{l->mu};
        l->stopping = true;
        l->queue.clear();
        if (l->fd >= 0)
          ::shutdown(l->fd, SHUT_RDWR);
        if (l->ring_out)
          l->ring_out->abort();
      }
      l->cv.notify_all();
      l->credit->stop();
    }
    join_all(links);
    if (acceptor_)
      acceptor_->stop(); // joins the accepted links' threads (they join their writers)
    if (local_acceptor_)
      local_acceptor_->stop();
    std::lock_guard<std::mutex> guard{mu_};
    channels_.clear();
  }

private:
  static bool alive(link& l) {
    std::lock_guard<std::mutex> lg{l.mu};
    return !l.dead && !l.stopping;
  }

  void purge_tokens() {
    auto now = clk::now();
    for (auto i = tokens_.begin(); i != tokens_.end();)
      i = i->second.deadline < now ? tokens_.erase(i) : std::next(i);
  }

  /// Takes the finished links this side opened out of `links_` (under `mu_`); join them after.
  std::vector<std::shared_ptr<link>> reap() {
    std::vector<std::shared_ptr<link>> out;
    for (auto i = links_.begin(); i != links_.end();) {
      if ((*i)->outgoing && (*i)->finished) {
        out.push_back(*i);
        i = links_.erase(i);
      } else {
        ++i;
      }
    }
    if (!out.empty())
      fit_pool();
    return out;
  }

  /// Keeps as many free receive buffers as the open links can hold delivered at once, on top of
  /// `pool_buffers` (under `mu_`): with fewer, steady traffic over many links freed a buffer and
  /// allocated (and faulted in) a new one for almost every payload (at 4 kept buffers, a 4-peer
  /// 16M-float round faulted in ~4 MB per process).
  void fit_pool() {
    pool_->set_keep(opts_.pool_buffers +
                    static_cast<size_t>(std::max<uint32_t>(1, opts_.link_buffers)) * links_.size());
  }

  static void join_all(std::vector<std::shared_ptr<link>>& links) {
    for (auto& l : links)
      if (l->outgoing && l->writer.joinable())
        l->writer.join();
  }

  /// A TCP link's congestion control (`transport_options::congestion_control`, checked at
  /// open: a refusal here, e.g. a module unloaded since, leaves the system's).
  void tune_tcp(int fd) {
    if (!opts_.congestion_control.empty())
      (void) set_congestion_control(fd, opts_.congestion_control);
  }

  void record_failure(std::string what) {
    std::lock_guard<std::mutex> guard{mu_};
    ++failed_;
    last_error_ = std::move(what);
  }

  /// Counts a sealed link's refusal by reason (its line is recorded where the link closes).
  void count(const char* reason) {
    std::lock_guard<std::mutex> guard{mu_};
    ++refusals_[reason];
  }

  count_fn counter() {
    return [this](const char* reason) { count(reason); };
  }

  /// Ciphers of a sealed link's two directions, from its session.
  static std::pair<std::unique_ptr<record_cipher>, std::unique_ptr<record_cipher>>
  ciphers_of(const link_session& s) {
    return {std::make_unique<record_cipher>(s.cipher, s.tx),
            std::make_unique<record_cipher>(s.cipher, s.rx)};
  }

  /// The proven peer key must belong to a node the gate admits now.
  status admitted(const std::string& peer_key) {
    auto line = opts_.security->admit ? opts_.security->admit(auth::peer_id_of(peer_key))
                                      : std::string{};
    if (line.empty())
      return {};
    count("not_admitted");
    return fail("sealed link: the peer's node key is not admitted: " + line);
  }

  /// The connector's side of a sealed link's handshake, after the TCP connect.
  result<link_session> seal_outgoing(int fd, const link_token& token) {
    auto& sec = *opts_.security;
    link_handshake hs{*sec.key, sec.experiment, token,
                      sec.ciphers != 0 ? sec.ciphers : local_ciphers()};
    uint8_t pre[link_preamble_bytes];
    write_sealed_preamble(token, pre);
    if (auto st = send_all(fd, pre, sizeof pre, MSG_MORE); !st)
      return fail(st.what());
    auto hello = hs.hello();
    if (auto st = send_all(fd, hello.data(), hello.size()); !st)
      return fail(st.what());
    uint8_t reply[link_reply_bytes];
    size_t got = 0;
    if (auto st = recv_all(fd, reply, sizeof reply, got); !st) {
      count("handshake");
      return fail("sealed link: the acceptor's reply: " + st.what());
    }
    if (auto st = hs.on_reply(reply, sizeof reply); !st) {
      count(hs.forged() ? "signature" : "handshake");
      return fail(st.what());
    }
    if (auto st = admitted(hs.session().peer_key); !st)
      return fail(st.what());
    auto fin = hs.finish();
    if (auto st = send_all(fd, fin.data(), fin.size()); !st)
      return fail(st.what());
    return hs.session();
  }

  /// The acceptor's side, after a sealed preamble with a token it issued.
  result<link_session> seal_incoming(int fd, const link_token& token) {
    auto& sec = *opts_.security;
    link_handshake hs{*sec.key, sec.experiment, token,
                      sec.ciphers != 0 ? sec.ciphers : local_ciphers()};
    uint8_t hello[link_hello_bytes];
    size_t got = 0;
    if (auto st = recv_all(fd, hello, sizeof hello, got); !st) {
      count("handshake");
      return fail("sealed link: the connector's hello: " + st.what());
    }
    if (auto st = hs.on_hello(hello, sizeof hello); !st) {
      count("handshake");
      return fail(st.what());
    }
    auto reply = hs.reply();
    if (!reply) {
      count("handshake");
      return reply.error();
    }
    if (auto st = send_all(fd, reply->data(), reply->size()); !st)
      return fail(st.what());
    uint8_t fin[link_finish_bytes];
    if (auto st = recv_all(fd, fin, sizeof fin, got); !st) {
      count("handshake");
      return fail("sealed link: the connector's finish: " + st.what());
    }
    if (auto st = hs.on_finish(fin, sizeof fin); !st) {
      count(hs.forged() ? "signature" : "handshake");
      return fail(st.what());
    }
    if (auto st = admitted(hs.session().peer_key); !st)
      return fail(st.what());
    return hs.session();
  }

  std::vector<std::shared_ptr<channel_handler>> handlers() {
    std::lock_guard<std::mutex> guard{mu_};
    std::vector<std::shared_ptr<channel_handler>> out;
    for (auto& [id, h] : channels_)
      out.push_back(h);
    return out;
  }

  /// Ends a link: both its threads wake up and stop. The first reason counts, and is recorded
  /// as a failure unless the peer closed cleanly or the transport stops.
  void close_link(link& l, const std::string& why, bool clean = false) {
    bool first = false;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lg{l.mu};
      if (!l.dead) {
        l.dead = true;
        l.why = why;
        first = true;
      }
      stopping = l.stopping;
      l.queue.clear();
    }
    // Recorded before the socket is shut: whoever sees the link close (the peer, a test) then
    // finds the reason. (Not under `l.mu`: `mu_` is taken before a link's mutex elsewhere.)
    if (first && !clean && !stopping)
      record_failure("link " + std::string{l.outgoing ? "to " : "from "} + l.peer + ": " + why);
    {
      std::lock_guard<std::mutex> lg{l.mu};
      if (l.fd >= 0)
        ::shutdown(l.fd, SHUT_RDWR);
    }
    l.cv.notify_all();
    l.credit->stop();
    std::lock_guard<std::mutex> lg{l.mu};
    if (l.ring_out)
      l.ring_out->abort(); // a writer waiting for ring space
  }

  /// After a link's threads stopped: tells the handlers unless the transport stops.
  void report_lost(link& l) {
    std::string why;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lg{l.mu};
      why = l.why;
      stopping = l.stopping;
    }
    if (stopping)
      return;
    auto what = "link " + std::string{l.outgoing ? "to " : "from "} + l.peer + ": " + why;
    for (auto& h : handlers())
      h->link_lost(l.peer, what);
  }

  void announce_up(const std::string& peer) {
    for (auto& h : handlers())
      h->link_up(peer);
  }

  // -- a link this side opened (its writer thread) ---------------------------------------------

  void run_outgoing(const std::shared_ptr<link>& l, std::string host, uint16_t port,
                    link_token token) {
    auto opened = [&]() -> status {
      if (!opts_.security && opts_.local_links && open_local(*l, host, port, token)) {
        ++connections_;
        ++local_links_;
        l->local = true;
        l->out = std::make_unique<link_out>(l->fd, nullptr);
        l->in = std::make_unique<link_in>(l->fd, nullptr, counter());
        return {};
      }
      std::string why;
      int fd = connect_ipv4(host, port, send_buffer, why, opts_.io_timeout);
      if (fd < 0)
        return fail(why);
      ++connections_;
      set_timeouts(fd, opts_.io_timeout);
      tune_tcp(fd);
      {
        std::lock_guard<std::mutex> lg{l->mu};
        l->fd = fd;
        if (l->stopping) {
          ::shutdown(fd, SHUT_RDWR);
          return fail("stopped");
        }
      }
      if (!opts_.security) {
        uint8_t pre[link_preamble_bytes];
        write_link_preamble(token, pre);
        if (auto st = send_all(fd, pre, sizeof pre); !st)
          return st;
        l->out = std::make_unique<link_out>(fd, nullptr);
        l->in = std::make_unique<link_in>(fd, nullptr, counter());
        return {};
      }
      auto session = seal_outgoing(fd, token);
      if (!session)
        return fail(session.error().what);
      auto [tx, rx] = ciphers_of(*session);
      l->peer_key = session->peer_key;
      l->out = std::make_unique<link_out>(fd, std::move(tx));
      l->in = std::make_unique<link_in>(fd, std::move(rx), counter());
      return {};
    }();
    if (opened) {
      announce_up(l->peer);
      l->reader = std::thread([this, l] {
        auto st = read_frames(*l);
        close_link(*l, st ? std::string{"closed by the peer"} : st.what(), st.ok());
      });
      auto st = write_frames(*l);
      close_link(*l, st.what());
      l->reader.join();
    } else {
      close_link(*l, opened.what());
    }
    {
      std::lock_guard<std::mutex> lg{l->mu};
      if (l->fd >= 0)
        ::close(l->fd);
      l->fd = -1;
    }
    report_lost(*l);
    l->finished = true;
  }

  /// A fresh ring for this side of a same-host link; null when rings are off or the system
  /// gives none (the link then carries payloads on its socket).
  std::shared_ptr<ring_map> own_ring() {
    if (opts_.ring_bytes == 0)
      return nullptr;
    auto r = ring_map::create(opts_.ring_bytes);
    return r ? std::move(*r) : nullptr;
  }

  /// Tries the same-host Unix socket of the transport listening on `host:port`: connected,
  /// owned by this user, the token sent and acknowledged. True with `l.fd` set; false (the
  /// caller falls back to TCP) when nothing listens there or it did not acknowledge.
  bool open_local(link& l, const std::string& host, uint16_t port, const link_token& token) {
    std::string why;
    int fd = connect_local(local_link_name(host, port), why);
    if (fd < 0)
      return false; // not on this host (or its transport has no local socket)
    if (!same_user(fd)) {
      ::close(fd);
      return false;
    }
    set_timeouts(fd, opts_.io_timeout);
    set_send_buffer(fd, send_buffer);
    {
      std::lock_guard<std::mutex> lg{l.mu};
      if (l.stopping) {
        ::close(fd);
        return false;
      }
      l.fd = fd; // from here `stop` can shut it down
    }
    uint8_t pre[link_preamble_bytes];
    write_link_preamble(token, pre, link_local_version);
    auto mine = own_ring();
    uint8_t ack = 0;
    int theirs = -1;
    if (send_with_fd(fd, pre, sizeof pre, mine ? mine->fd() : -1) &&
        recv_with_fd(fd, &ack, 1, theirs) && ack == link_local_ack) {
      // The peer accepted this side's ring with its acknowledgement. (Set under the link's
      // mutex: `stop` may look at it meanwhile; the writer thread, this one, reads it freely.)
      if (mine) {
        std::lock_guard<std::mutex> lg{l.mu};
        l.ring_out = std::make_unique<ring_writer>(std::move(mine));
      }
      if (theirs < 0)
        return true;
      auto ring = ring_map::adopt(theirs);
      if (ring) {
        l.ring_in = std::make_shared<ring_reader>(std::move(*ring));
        return true;
      }
      count("ring");
      record_failure("local link to " + l.peer + ": " + ring.error().what);
      // The peer's token is spent: close, the TCP fallback fails on it and reports the link.
    } else if (theirs >= 0) {
      ::close(theirs);
    }
    {
      std::lock_guard<std::mutex> lg{l.mu};
      l.fd = -1;
    }
    ::close(fd);
    return false;
  }

  // -- a link the peer opened (on the acceptor's connection thread) ----------------------------

  /// Serves a link the peer opened over TCP, or over the same-host Unix socket (`local`).
  void serve(int fd, bool local) {
    set_timeouts(fd, opts_.io_timeout);
    if (local) {
      if (!same_user(fd)) {
        record_failure("incoming local link: from a process of another user");
        return;
      }
      set_send_buffer(fd, send_buffer);
    } else {
      tune_tcp(fd);
    }
    uint8_t pre[link_preamble_bytes];
    size_t got = 0;
    int theirs = -1; // a same-host peer's ring
    if (auto st = local ? recv_with_fd(fd, pre, sizeof pre, theirs)
                        : recv_all(fd, pre, sizeof pre, got);
        !st) {
      record_failure("incoming link: preamble: " + st.what());
      return;
    }
    struct fd_guard {
      int& fd;
      ~fd_guard() {
        if (fd >= 0)
          ::close(fd);
      }
    } theirs_guard{theirs};
    auto token = opts_.security ? parse_sealed_preamble(pre, sizeof pre)
                 : local        ? parse_link_preamble(pre, sizeof pre, link_local_version)
                                : parse_link_preamble(pre, sizeof pre);
    if (!token) {
      if (opts_.security && parse_link_preamble(pre, sizeof pre).ok()) {
        count("plaintext");
        record_failure("incoming link: a plaintext link refused: this transport's links are "
                       "sealed (a closed run)");
      } else {
        record_failure("incoming link: " + token.error().what);
      }
      return;
    }
    auto l = std::make_shared<link>();
    l->fd = fd;
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      purge_tokens();
      auto i = tokens_.find(*token);
      if (i == tokens_.end()) {
        ++failed_;
        last_error_ = "incoming link: unknown or expired token";
        return;
      }
      l->peer = std::move(i->second.peer);
      tokens_.erase(i); // one-time
    }
    if (opts_.security) {
      auto session = seal_incoming(fd, *token);
      if (!session) {
        record_failure("incoming link from " + l->peer + ": " + session.error().what);
        return;
      }
      auto [tx, rx] = ciphers_of(*session);
      l->peer_key = session->peer_key;
      l->out = std::make_unique<link_out>(fd, std::move(tx));
      l->in = std::make_unique<link_in>(fd, std::move(rx), counter());
    } else {
      if (local) {
        if (theirs >= 0) {
          auto ring = ring_map::adopt(std::exchange(theirs, -1));
          if (!ring) {
            count("ring");
            record_failure("incoming local link from " + l->peer + ": " + ring.error().what);
            return;
          }
          l->ring_in = std::make_shared<ring_reader>(std::move(*ring));
        }
        auto mine = own_ring();
        uint8_t ack = link_local_ack;
        if (auto st = send_with_fd(fd, &ack, 1, mine ? mine->fd() : -1); !st) {
          record_failure("incoming local link from " + l->peer + ": " + st.what());
          return;
        }
        if (mine)
          l->ring_out = std::make_unique<ring_writer>(std::move(mine));
        l->local = true;
      }
      l->out = std::make_unique<link_out>(fd, nullptr);
      l->in = std::make_unique<link_in>(fd, nullptr, counter());
    }
    {
      std::lock_guard<std::mutex> guard{mu_};
      if (stopped_)
        return;
      links_.push_back(l);
      fit_pool();
      l->writer = std::thread([this, l] {
        auto st = write_frames(*l);
        close_link(*l, st.what());
      });
    }
    announce_up(l->peer);
    auto st = read_frames(*l);
    close_link(*l, st ? std::string{"closed by the peer"} : st.what(), st.ok());
    l->writer.join();
    {
      std::lock_guard<std::mutex> guard{mu_};
      links_.erase(std::remove(links_.begin(), links_.end(), l), links_.end());
      fit_pool();
    }
    report_lost(*l);
    // The acceptor closes the socket.
  }

  // -- writing ----------------------------------------------------------------------------------

  /// Sends queued frames until the link dies or stops; the reason.
  status write_frames(link& l) {
    for (;;) {
      std::shared_ptr<outgoing_frame> f;
      {
        std::unique_lock<std::mutex> lk{l.mu};
        l.cv.wait(lk, [&] { return l.stopping || l.dead || !l.queue.empty(); });
        if (l.stopping)
          return fail("stopped");
        if (l.dead)
          return fail(l.why);
        f = std::move(l.queue.front());
        l.queue.pop_front();
      }
      auto& out = *l.out;
      auto& meta = f->meta();
      if (meta.size() > link_max_meta_bytes)
        return fail("a frame's meta of " + std::to_string(meta.size()) + " bytes");
      std::shared_ptr<const messages::chunk_source> payload;
      if (f->payload()) {
        if (auto& st = f->payload()->encode(); !st)
          return st;
        payload = f->payload()->bytes();
      }
      if (payload && l.ring_out && payload->size() > 0 &&
          payload->size() <= l.ring_out->ring().capacity() / 2) {
        auto sent = write_ring_frame(l, meta, *payload);
        if (!sent)
          return sent.error();
        if (*sent)
          continue;
      }
      link_frame_header h;
      h.meta_bytes = static_cast<uint32_t>(meta.size());
      h.payload_bytes = payload ? payload->size() : 0;
      uint8_t raw[link_frame_header_bytes];
      write_link_frame_header(h, raw);
      if (auto st = out.write(raw, sizeof raw, MSG_MORE); !st)
        return st;
      if (auto st = out.write(meta.data(), meta.size(), payload ? MSG_MORE : 0); !st)
        return st;
      if (payload) {
        status sent;
        auto t0 = clk::now();
        payload->for_each(0, payload->size(), [&](const char* p, size_t n) -> caf::error {
          sent = out.write(p, n);
          return sent ? caf::error{} : caf::make_error(caf::sec::runtime_error);
        });
        if (!sent)
          return sent;
        if (auto st = out.flush(); !st)
          return st;
        auto dt = std::chrono::duration<double>(clk::now() - t0).count();
        std::lock_guard<std::mutex> guard{stats_mu_};
        auto& w = written_[l.peer];
        w.bytes += payload->size();
        w.seconds += dt;
      } else if (auto st = out.flush(); !st) {
        return st;
      }
    }
  }

  /// A frame whose payload goes through this side's ring: copied in once (after waiting for
  /// room), then the header, meta and position in one write. False when the peer's handlers
  /// hold the ring (the frame goes on the socket).
  result<bool> write_ring_frame(link& l, const std::vector<uint8_t>& meta,
                                const messages::chunk_source& payload) {
    auto t0 = clk::now();
    auto size = payload.size();
    auto room = l.ring_out->reserve(size, opts_.io_timeout, ring_grace);
    if (!room)
      return room.error();
    if (!*room)
      return false;
    auto pos = *room;
    auto* dst = l.ring_out->ring().at(*pos);
    payload.for_each(0, size, [&](const char* p, size_t n) -> caf::error {
      std::memcpy(dst, p, n);
      dst += n;
      return caf::error{};
    });
    std::vector<uint8_t> head(link_frame_header_bytes + meta.size() + link_ring_position_bytes);
    write_link_frame_header({static_cast<uint32_t>(meta.size()), size, true}, head.data());
    std::memcpy(head.data() + link_frame_header_bytes, meta.data(), meta.size());
    write_le(head.data() + link_frame_header_bytes + meta.size(), *pos, 8);
    if (auto st = l.out->write(head.data(), head.size()); !st)
      return fail(st.what());
    auto dt = std::chrono::duration<double>(clk::now() - t0).count();
    std::lock_guard<std::mutex> guard{stats_mu_};
    auto& w = written_[l.peer];
    w.bytes += size;
    w.seconds += dt;
    return true;
  }

  // -- reading ----------------------------------------------------------------------------------

  /// Waits until `fd` is readable (or closed); no timeout: links idle between uses.
  static bool wait_readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    for (;;) {
      auto r = ::poll(&p, 1, -1);
      if (r < 0 && errno == EINTR)
        continue;
      return r > 0;
    }
  }

  std::shared_ptr<channel_handler> handler(uint32_t channel) {
    std::lock_guard<std::mutex> guard{mu_};
    auto i = channels_.find(channel);
    return i == channels_.end() ? nullptr : i->second;
  }

  /// Reads frames until the link closes (success) or something is malformed (the reason).
  status read_frames(link& l) {
    auto& in = *l.in;
    auto& peer = l.peer;
    auto& credit = l.credit;
    std::vector<uint8_t> meta;
    for (;;) {
      uint8_t raw[link_frame_header_bytes];
      if (!in.buffered()) {
        if (!wait_readable(in.fd()))
          return {};
        auto r = ::recv(in.fd(), raw, 1, MSG_PEEK);
        if (r <= 0)
          return {}; // closed between frames: a clean end
      }
      if (auto st = in.read(raw, sizeof raw); !st)
        return fail("frame header from " + peer + ": " + st.what());
      auto h = parse_link_frame_header(raw, sizeof raw);
      if (!h)
        return h.error();
      if (h->payload_bytes > opts_.max_payload_bytes)
        return fail("a frame from " + peer + " declares a payload of "
                    + std::to_string(h->payload_bytes) + " bytes, more than the limit of "
                    + std::to_string(opts_.max_payload_bytes));
      meta.resize(h->meta_bytes);
      if (auto st = in.read(meta.data(), meta.size()); !st)
        return fail("meta from " + peer + ": " + st.what());
      // A ring frame's payload is claimed at once (the region stays in step with the writer's
      // whatever happens to the frame) and given back wherever it is not delivered.
      std::optional<uint64_t> ring_pos;
      if (h->in_ring) {
        if (!l.ring_in) {
          count("ring");
          return fail("a ring frame from " + peer + " on a link without a ring");
        }
        uint8_t raw_pos[link_ring_position_bytes];
        if (auto st = in.read(raw_pos, sizeof raw_pos); !st)
          return fail("ring position from " + peer + ": " + st.what());
        auto pos = read_le(raw_pos, 8);
        if (auto st = l.ring_in->claim(pos, h->payload_bytes); !st) {
          count("ring");
          return fail("a frame from " + peer + ": " + st.what());
        }
        ring_pos = pos;
      }
      auto drop = [&](uint64_t n) -> status {
        if (ring_pos) {
          l.ring_in->release(*ring_pos);
          return {};
        }
        return discard(in, n);
      };
      auto channel = static_cast<uint32_t>(read_le(meta.data(), 4));
      const uint8_t* body = meta.data() + 4;
      size_t body_size = meta.size() - 4;
      auto h_ = handler(channel);
      if (!h_) { // a channel closed meanwhile (its user stopped): read and drop the frame
        if (auto st = drop(h->payload_bytes); !st)
          return fail("payload from " + peer + ": " + st.what());
        continue;
      }
      if (auto st = h_->admit(peer, body, body_size, h->payload_bytes); !st) {
        record_failure("a frame from " + peer + ": " + st.what());
        if (!h_->refused(peer, body, body_size, st.what()))
          return st;
        if (auto d = drop(h->payload_bytes); !d)
          return fail("payload from " + peer + ": " + d.what());
        continue;
      }
      messages::tensor_msg payload;
      if (h->payload_bytes > 0) {
        if (!credit->acquire(std::max<uint32_t>(1, opts_.link_buffers))) {
          if (ring_pos)
            l.ring_in->release(*ring_pos);
          return {}; // stopping
        }
        // The slot returns when the handler drops the payload's tensor (at once on failure).
        struct slot_guard {
          link_credit* c;
          ~slot_guard() {
            if (c != nullptr)
              c->release();
          }
        } guard{credit.get()};
        auto check = [&](const kernels::tensor_header& th) {
          return h_->check(peer, body, body_size, th);
        };
        status decoded;
        if (ring_pos) {
          decoded = decode_ring(l.ring_in, *ring_pos, h->payload_bytes, pool_, check, payload);
        } else {
          auto b = pool_->take(h->payload_bytes);
          if (auto st = in.read(b.data.get(), h->payload_bytes); !st) {
            pool_->give(std::move(b));
            return fail("payload from " + peer + ": " + st.what());
          }
          decoded = decode_pooled(pool_, std::move(b), h->payload_bytes, check, payload);
        }
        if (auto& st = decoded; !st) {
          auto why = "payload from " + peer + ": " + st.what();
          record_failure(why);
          if (!h_->refused(peer, body, body_size, "decode: " + st.what()))
            return fail(why);
          continue; // the bytes were read: the link is still in step
        }
        if (payload.tensor.defined()) {
          auto hold = std::make_shared<credit_hold>();
          hold->tensor = payload.tensor;
          hold->credit = credit;
          auto& t = hold->tensor;
          payload.tensor = at::from_blob(
            t.data_ptr(), t.sizes(), t.strides(), [hold](void*) mutable { hold.reset(); },
            t.options());
          guard.c = nullptr; // the tensor holds the slot now
        }
      }
      ++delivered_; // first: a handler that got the frame sees it counted
      if (auto st = h_->deliver(peer, std::vector<uint8_t>(body, body + body_size),
                                std::move(payload));
          !st)
        return st;
    }
  }

  /// Reads and drops `n` bytes.
  static status discard(link_in& in, uint64_t n) {
    std::vector<char> sink(size_t{1} << 16);
    while (n > 0) {
      auto take = static_cast<size_t>(std::min<uint64_t>(n, sink.size()));
      if (auto st = in.read(sink.data(), take); !st)
        return st;
      n -= take;
    }
    return {};
  }

  transport_options opts_;
  std::string id_;
  std::string host_;
  uint16_t port_;
  std::shared_ptr<buffer_pool> pool_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  std::map<link_token, token_entry> tokens_;
  std::vector<std::shared_ptr<link>> links_;
  std::map<uint32_t, std::shared_ptr<channel_handler>> channels_;
  uint32_t next_channel_ = first_dynamic_channel;
  std::unique_ptr<acceptor> acceptor_;
  /// Same-host links (`local_links`), when its socket could be bound.
  std::unique_ptr<acceptor> local_acceptor_;
  mutable std::mutex stats_mu_;
  std::map<std::string, link_stats> written_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> local_links_{0};
  std::string last_error_;
  std::map<std::string, uint64_t> refusals_;
};

} // namespace

result<std::shared_ptr<transport>> transport::open(transport_options opts) {
  if (sodium_init() < 0)
    return fail("cannot open the direct transport: libsodium failed to initialize");
  std::string cc_note;
  if (!opts.congestion_control.empty()) {
    if (!congestion_control_name(opts.congestion_control))
      return fail("cannot open the direct transport: '" + opts.congestion_control
                  + "' is not a TCP congestion control's name (1-15 of a-z, 0-9 and _)");
    if (auto why = check_congestion_control(opts.congestion_control); !why.empty()) {
      cc_note = why + ": TCP links use the system's congestion control";
      opts.congestion_control.clear();
    }
  }
  if (opts.security && (!opts.security->key || opts.security->key->public_key().empty()))
    return fail("cannot open the direct transport: sealed links need this node's key");
  int fd = -1;
  int local_fd = -1;
  uint16_t port = 0;
  if (!opts.host.empty()) {
    if (auto st = check_ipv4(opts.host); !st)
      return fail("cannot open the direct transport: " + st.what());
    std::string why;
    auto host = opts.host == "localhost" ? std::string{"127.0.0.1"} : opts.host;
    fd = listen_ipv4(host, opts.port, port, why);
    if (fd < 0)
      return fail("cannot open the direct transport: " + why);
    // A taken name (another process's) leaves this transport on TCP only: dialers that reach
    // that socket get no acknowledgement for this transport's tokens and fall back.
    if (opts.local_links && !opts.security)
      local_fd = listen_local(local_link_name(host, port), why);
  }
  auto t = std::make_shared<transport_impl>(std::move(opts), fd, port, local_fd);
  if (!cc_note.empty())
    t->note(std::move(cc_note));
  return std::shared_ptr<transport>{std::move(t)};
}

} // namespace starling::actors::transfer
