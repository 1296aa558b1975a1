// A channel handler for direct-transport tests: queues the frames and lost links that arrive,
// refuses payloads that are not 1-D, and waits (bounded) for the next of each; and transports
// with a collector each (`transports`).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "actors/transfer/transport.hpp"

namespace starling::testing {

struct frame_got {
  std::string peer;
  std::vector<uint8_t> body;
  messages::tensor_msg payload;
};

/// A channel handler that queues what arrives; payloads must be 1-D.
struct collector : actors::transfer::channel_handler {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<frame_got> frames;
  std::deque<std::pair<std::string, std::string>> losses;
  std::vector<std::string> ups;

  status check(const std::string&, const uint8_t*, size_t,
               const kernels::tensor_header& h) override {
    if (h.shape.size() != 1)
      return fail("a 1-D tensor was expected");
    return {};
  }
  status deliver(const std::string& peer, std::vector<uint8_t> body,
                 messages::tensor_msg payload) override {
    {
      std::lock_guard<std::mutex> g{mu};
      frames.push_back({peer, std::move(body), std::move(payload)});
    }
    cv.notify_all();
    return {};
  }
  void link_up(const std::string& peer) override {
    std::lock_guard<std::mutex> g{mu};
    ups.push_back(peer);
  }
  void link_lost(const std::string& peer, const std::string& why) override {
    {
      std::lock_guard<std::mutex> g{mu};
      losses.emplace_back(peer, why);
    }
    cv.notify_all();
  }

  std::optional<frame_got> next(std::chrono::milliseconds wait = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk{mu};
    if (!cv.wait_for(lk, wait, [&] { return !frames.empty(); }))
      return std::nullopt;
    auto f = std::move(frames.front());
    frames.pop_front();
    return f;
  }
  std::optional<std::pair<std::string, std::string>> lost(std::chrono::milliseconds wait = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk{mu};
    if (!cv.wait_for(lk, wait, [&] { return !losses.empty(); }))
      return std::nullopt;
    auto l = losses.front();
    losses.pop_front();
    return l;
  }
};

/// Transports, each with a collector on one channel (the same number everywhere), stopped at
/// the end.
struct transports {
  std::vector<std::shared_ptr<actors::transfer::transport>> t;
  std::vector<std::shared_ptr<collector>> c;
  uint32_t channel = 0;

  explicit transports(std::vector<actors::transfer::transport_options> opts) {
    for (auto& o : opts) {
      auto x = actors::transfer::transport::open(o);
      REQUIRE_MESSAGE(x, (x ? std::string{} : x.error().what));
      t.push_back(*x);
      c.push_back(std::make_shared<collector>());
      channel = t.back()->add_channel(c.back());
    }
  }
  explicit transports(size_t n, actors::transfer::transport_options o = {})
    : transports(std::vector<actors::transfer::transport_options>(n, o)) {}
  ~transports() {
    for (auto& x : t)
      x->stop();
  }
  transports(const transports&) = delete;
  transports& operator=(const transports&) = delete;

  /// Links `from` to `to` (a token `to` issued for `from`'s id).
  void link(size_t from, size_t to) {
    auto token = t[to]->issue(t[from]->id());
    REQUIRE(t[from]->connect(t[to]->id(), t[to]->host(), t[to]->port(), token));
  }

  std::shared_ptr<actors::transfer::outgoing_frame>
  frame(std::vector<uint8_t> body, at::Tensor v = {},
        kernels::codec_id codec = kernels::codec_id::none) {
    return std::make_shared<actors::transfer::outgoing_frame>(channel, std::move(body),
                                                              std::move(v), codec);
  }
};

} // namespace starling::testing
