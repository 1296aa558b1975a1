// A channel handler for direct-transport tests: queues the frames and lost links that arrive,
// refuses payloads that are not 1-D, and waits (bounded) for the next of each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

} // namespace starling::testing
