#include "actors/transfer/data_channel.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <sodium.h>

#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::actors::transfer {

using messages::direct_announce;
using messages::direct_endpoint;
using messages::tensor_msg;
using messages::transfer_report;
using clk = std::chrono::steady_clock;

namespace {

/// An announced transfer waiting for its frame.
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
  if (static_cast<uint8_t>(h.dtype) != p.dtype || h.shape != p.shape
      || static_cast<uint8_t>(h.codec) != p.codec)
    return fail("the payload's dtype, shape or codec differs from the announcement");
  return {};
}

link_token token_of(const uint8_t* body) {
  link_token t;
  std::memcpy(t.data(), body, t.size());
  return t;
}

/// The receiving side: announced transfers arrive on `transfer_channel`.
class receive_channel final : public channel_handler {
public:
  receive_channel(std::weak_ptr<transport> t, std::chrono::milliseconds ttl)
    : transport_(std::move(t)), ttl_(ttl) {}

  /// Remembers an announcement; fails on a duplicate token.
  status expect(const link_token& token, pending p) {
    std::lock_guard<std::mutex> guard{mu_};
    purge(clk::now());
    p.deadline = clk::now() + ttl_;
    if (!expected_.emplace(token, std::move(p)).second)
      return fail("a transfer with this token is already announced");
    return {};
  }

  status admit(const std::string& peer, const uint8_t* body, size_t size,
               uint64_t payload_bytes) override {
    if (size != link_token{}.size())
      return fail("data channel: a transfer frame's meta of " + std::to_string(size)
                  + " bytes, expected a 16-byte token");
    std::lock_guard<std::mutex> guard{mu_};
    purge(clk::now());
    auto i = expected_.find(token_of(body));
    if (i == expected_.end())
      return fail("data channel: unknown or expired token");
    auto p = std::move(i->second);
    expected_.erase(i); // one-time, whatever happens next
    if (payload_bytes != p.total)
      return fail("data channel: the frame declares " + std::to_string(payload_bytes)
                  + " bytes, the announcement " + std::to_string(p.total));
    if (payload_bytes > p.max_bytes)
      return fail("data channel: the frame declares " + std::to_string(payload_bytes)
                  + " bytes, more than the limit of " + std::to_string(p.max_bytes));
    active_[peer] = std::move(p); // frames of one link come one at a time
    return {};
  }

  status check(const std::string& peer, const uint8_t*, size_t,
               const kernels::tensor_header& h) override {
    std::lock_guard<std::mutex> guard{mu_};
    auto i = active_.find(peer);
    if (i == active_.end())
      return fail("data channel: no transfer in progress");
    return matches(i->second, h);
  }

  status deliver(const std::string& peer, std::vector<uint8_t> body,
                 messages::tensor_msg payload) override {
    caf::actor sink;
    {
      std::lock_guard<std::mutex> guard{mu_};
      auto i = active_.find(peer);
      if (i == active_.end())
        return fail("data channel: no transfer in progress");
      sink = std::move(i->second.sink);
      active_.erase(i);
    }
    if (!payload.tensor.defined()) {
      answer(peer, token_of(body.data()), "data channel: a transfer without a payload");
      return {};
    }
    ++delivered_;
    caf::anon_send(sink, std::move(payload));
    answer(peer, token_of(body.data()), {});
    return {};
  }

  bool refused(const std::string& peer, const uint8_t* body, size_t size,
               const std::string& why) override {
    {
      std::lock_guard<std::mutex> guard{mu_};
      active_.erase(peer);
      ++failed_;
      last_error_ = why;
    }
    if (size != link_token{}.size())
      return false; // not even a transfer: a hostile or broken peer
    auto text = why.rfind("data channel: ", 0) == 0 ? why : "data channel: " + why;
    answer(peer, token_of(body), text);
    return true;
  }

  void forget() {
    std::lock_guard<std::mutex> guard{mu_};
    expected_.clear();
    active_.clear();
  }

  uint64_t delivered() const { return delivered_; }
  uint64_t failed() const { return failed_; }
  std::string last_error() const {
    std::lock_guard<std::mutex> guard{mu_};
    return last_error_;
  }

private:
  void purge(clk::time_point now) {
    for (auto i = expected_.begin(); i != expected_.end();)
      i = i->second.deadline < now ? expected_.erase(i) : std::next(i);
  }

  /// The transfer's status, back on the link it came on (best effort: the sender may be gone).
  void answer(const std::string& peer, const link_token& token, const std::string& text) {
    if (auto t = transport_.lock())
      t->send(peer, std::make_shared<outgoing_frame>(transfer_status_channel,
                                                     encode_transfer_status(token, text)));
  }

  std::weak_ptr<transport> transport_;
  std::chrono::milliseconds ttl_;
  mutable std::mutex mu_;
  std::map<link_token, pending> expected_;
  std::map<std::string, pending> active_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::string last_error_;
};

/// Told when a transfer ends: the error ("" = delivered) and whether its link ever opened.
using done_fn = std::function<void(const std::string& error, bool connected)>;

/// The sending side: statuses arrive on `transfer_status_channel`.
class status_channel final : public channel_handler {
public:
  void wait(const link_token& token, const std::string& peer, done_fn done) {
    std::lock_guard<std::mutex> guard{mu_};
    waiting_[token] = {peer, std::move(done)};
  }

  status admit(const std::string&, const uint8_t* body, size_t size,
               uint64_t payload_bytes) override {
    if (payload_bytes != 0)
      return fail("data channel: a transfer status with a payload");
    if (auto st = decode_transfer_status(body, size); !st)
      return st.error();
    return {};
  }

  status deliver(const std::string& peer, std::vector<uint8_t> body,
                 messages::tensor_msg) override {
    auto st = decode_transfer_status(body.data(), body.size());
    if (!st)
      return st.error();
    done_fn done;
    {
      std::lock_guard<std::mutex> guard{mu_};
      auto i = waiting_.find(st->first);
      if (i == waiting_.end() || i->second.first != peer)
        return {}; // not ours (any more): ignored
      done = std::move(i->second.second);
      waiting_.erase(i);
    }
    done(st->second.empty() ? std::string{} : "the receiver reports: " + st->second, true);
    return {};
  }

  void link_up(const std::string& peer) override {
    std::lock_guard<std::mutex> guard{mu_};
    up_.insert(peer);
  }

  void link_lost(const std::string& peer, const std::string& why) override {
    std::vector<done_fn> lost;
    bool connected = false;
    {
      std::lock_guard<std::mutex> guard{mu_};
      connected = up_.erase(peer) > 0;
      for (auto i = waiting_.begin(); i != waiting_.end();) {
        if (i->second.first == peer) {
          lost.push_back(std::move(i->second.second));
          i = waiting_.erase(i);
        } else {
          ++i;
        }
      }
    }
    for (auto& f : lost)
      f(why, connected);
  }

private:
  std::mutex mu_;
  std::map<link_token, std::pair<std::string, done_fn>> waiting_;
  std::set<std::string> up_;
};

class endpoint_impl final : public data_endpoint {
public:
  endpoint_impl(std::shared_ptr<transport> t, const data_channel_options& opts, bool owned)
    : transport_(std::move(t)), owned_(owned),
      rx_(std::make_shared<receive_channel>(transport_, opts.announce_ttl)),
      status_(std::make_shared<status_channel>()) {
    transport_->set_channel(transfer_channel, rx_);
    transport_->set_channel(transfer_status_channel, status_);
  }

  ~endpoint_impl() override { stop(); }

  const std::shared_ptr<transport>& link_layer() const override { return transport_; }
  const std::string& host() const override { return transport_->host(); }
  uint16_t port() const override { return transport_->port(); }
  uint64_t delivered() const override { return rx_->delivered(); }
  uint64_t failed() const override { return rx_->failed() + transport_->failed(); }
  std::string last_error() const override {
    auto e = rx_->last_error();
    return e.empty() ? transport_->last_error() : e;
  }

  void stop() override {
    if (stopped_.exchange(true))
      return;
    rx_->forget();
    if (owned_) {
      transport_->stop();
    } else {
      transport_->remove_channel(transfer_channel);
      transport_->remove_channel(transfer_status_channel);
    }
  }

  /// Receiver side of an announcement: expects its frame and lets its token open a link once.
  status expect(const link_token& token, pending p) {
    if (stopped_)
      return fail("the data endpoint is stopped");
    if (auto st = rx_->expect(token, std::move(p)); !st)
      return st;
    // A sender without a link to this node opens one with the token; a pooled link leaves it
    // unused until it expires.
    (void) transport_->accept(token, "transfer-" + token_to_hex(token));
    return {};
  }

  /// Sender side: the frame to `host:port`, on a pooled link or a new one; `done` tells how it
  /// ended.
  void send(const std::string& host, uint16_t port, const link_token& token,
            std::shared_ptr<const messages::chunk_source> payload, done_fn done) {
    // Its own key, not the peer transport's id: the receiving side names a link opened with a
    // transfer token "transfer-<token>", so an averager sharing this transport must not take
    // such a link for one to that transport (its peer would drop chunks from an unknown link).
    auto peer = "transfer@" + host + ":" + std::to_string(port);
    status_->wait(token, peer, done);
    if (auto st = transport_->connect(peer, host, port, token_to_hex(token)); !st) {
      status_->link_lost(peer, "cannot connect: " + st.what());
      return;
    }
    std::vector<uint8_t> body(token.begin(), token.end());
    auto frame = std::make_shared<outgoing_frame>(
      transfer_channel, body, std::make_shared<outgoing_payload>(std::move(payload)));
    if (!transport_->send(peer, std::move(frame)))
      status_->link_lost(peer, "the link to " + peer + " closed");
  }

private:
  std::shared_ptr<transport> transport_;
  bool owned_;
  std::shared_ptr<receive_channel> rx_;
  std::shared_ptr<status_channel> status_;
  std::atomic<bool> stopped_{false};
};

caf::error direct_error(std::string what) {
  return caf::make_error(caf::sec::runtime_error, "direct transfer: " + std::move(what));
}

/// A direct transfer whose status the sender waits for.
struct in_flight {
  uint64_t bytes = 0;
  caf::response_promise rp;
  std::function<void(std::string)> fallback;
};

struct direct_state {
  caf::actor chunks;
  std::shared_ptr<endpoint_impl> endpoint;
  bool own_endpoint = false;
  /// By token (hex).
  std::map<std::string, in_flight> waiting;
  static inline const char* name = "direct_sender";
};

caf::behavior direct_sender(caf::stateful_actor<direct_state>* self, direct_sender_options opts) {
  self->state.chunks = spawn_chunk_sender(self->system(), opts.chunks);
  self->link_to(self->state.chunks);
  if (opts.endpoint) {
    self->state.endpoint = std::static_pointer_cast<endpoint_impl>(opts.endpoint);
  } else {
    data_channel_options o;
    o.host.clear(); // client mode: this sender only opens links
    o.io_timeout = opts.io_timeout;
    if (auto ep = data_endpoint::open(o); ep) {
      self->state.endpoint = std::static_pointer_cast<endpoint_impl>(*ep);
      self->state.own_endpoint = true;
    }
  }
  self->attach_functor([self] {
    if (self->state.own_endpoint && self->state.endpoint)
      self->state.endpoint->stop();
  });
  return {
    [self, opts](transfer_atom, tensor_msg& x,
                 caf::actor receiver) -> caf::result<transfer_report> {
      if (!receiver)
        return direct_error("no receiver");
      auto header = kernels::make_header(x.tensor, x.codec, x.params);
      if (!header)
        return direct_error(header.error().what);
      auto source = messages::encode_tensor_source(x);
      if (!source)
        return direct_error(source.error().what);
      auto payload = std::move(*source);
      link_token token;
      randombytes_buf(token.data(), token.size());
      direct_announce a;
      a.token.assign(token.begin(), token.end());
      a.total_bytes = payload->size();
      a.dtype = static_cast<uint8_t>(header->dtype);
      a.shape = header->shape;
      a.codec = static_cast<uint8_t>(header->codec);
      auto rp = self->make_response_promise<transfer_report>();
      std::function<void(std::string)> fallback = [self, x, receiver, rp](std::string why) mutable {
        self->request(self->state.chunks, caf::infinite, transfer_atom::value, x, receiver)
          .then(
            [rp, why](uint64_t bytes) mutable {
              rp.deliver(transfer_report{bytes, "chunked", why});
            },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      };
      self->request(receiver, opts.announce_timeout, std::move(a))
        .then(
          [self, token, payload, rp, fallback](direct_endpoint& ep) mutable {
            if (!ep.wire_error.empty()) {
              rp.deliver(direct_error("the receiver's answer was refused: " + ep.wire_error));
              return;
            }
            if (ep.port == 0)
              return fallback("the receiver has no data endpoint");
            if (!self->state.endpoint)
              return fallback("this sender has no transport");
            if (auto st = check_listen_host(ep.host); !st) {
              rp.deliver(direct_error("refusing the receiver's data endpoint: " + st.what()));
              return;
            }
            // The link's threads report the end; the actor answers (a message to itself).
            auto hex = token_to_hex(token);
            self->state.waiting[hex] = in_flight{payload->size(), rp, fallback};
            caf::actor me = caf::actor_cast<caf::actor>(self);
            self->state.endpoint->send(ep.host, ep.port, token, std::move(payload),
                                       [me, hex](const std::string& error, bool connected) {
                                         caf::anon_send(me, transfer_atom::value, hex, error,
                                                        connected);
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
    [self](transfer_atom, const std::string& hex, const std::string& error, bool connected) {
      auto i = self->state.waiting.find(hex);
      if (i == self->state.waiting.end())
        return;
      auto t = std::move(i->second);
      self->state.waiting.erase(i);
      if (error.empty())
        t.rp.deliver(transfer_report{t.bytes, "direct", {}});
      else if (!connected)
        t.fallback("cannot connect to the data endpoint: " + error);
      else
        t.rp.deliver(direct_error(error));
    },
  };
}

} // namespace

result<std::shared_ptr<data_endpoint>> data_endpoint::open(const data_channel_options& opts) {
  transport_options t;
  t.host = opts.host;
  t.port = opts.port;
  t.io_timeout = opts.io_timeout;
  t.token_ttl = opts.announce_ttl;
  t.max_links = opts.max_connections;
  t.pool_buffers = opts.pool_buffers;
  t.security = opts.security;
  t.congestion_control = opts.congestion_control;
  auto tr = transport::open(t);
  if (!tr)
    return fail("cannot open a data endpoint: " + tr.error().what);
  return std::shared_ptr<data_endpoint>{std::make_shared<endpoint_impl>(*tr, opts, true)};
}

std::shared_ptr<data_endpoint> data_endpoint::on(std::shared_ptr<transport> t,
                                                 const data_channel_options& opts) {
  return std::make_shared<endpoint_impl>(std::move(t), opts, false);
}

caf::actor spawn_direct_receiver(caf::actor_system& sys, caf::actor sink,
                                 std::shared_ptr<data_endpoint> endpoint,
                                 receiver_options opts) {
  auto ep = std::static_pointer_cast<endpoint_impl>(std::move(endpoint));
  if (ep && ep->port() == 0)
    ep.reset(); // client mode: nobody can connect to it
  return sys.spawn([sink, ep, opts](caf::event_based_actor* self) -> caf::behavior {
    caf::message_handler announcements{
      [sink, ep, opts](direct_announce& a) -> caf::result<direct_endpoint> {
        // An announcement whose envelope was refused (counted by the wire context): the reason.
        if (!a.wire_error.empty())
          return caf::make_error(caf::sec::invalid_argument, "direct transfer: " + a.wire_error);
        if (!ep)
          return direct_endpoint{};
        if (a.token.size() != link_token{}.size())
          return caf::make_error(caf::sec::invalid_argument,
                                 "direct transfer: a token of " + std::to_string(a.token.size())
                                   + " bytes, expected 16");
        if (a.total_bytes == 0 || a.total_bytes > opts.max_bytes)
          return caf::make_error(caf::sec::invalid_argument,
                                 "direct transfer: refused " + std::to_string(a.total_bytes)
                                   + " bytes (limit " + std::to_string(opts.max_bytes) + ")");
        link_token token;
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
