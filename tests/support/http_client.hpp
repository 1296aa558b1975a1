// A minimal HTTP/1.1 client over raw sockets for tests of the node's endpoint: one request per
// connection to 127.0.0.1, everything bounded by a deadline (poll), no library of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace starling::testing {

/// An answer: the status code, the head (status line and headers) and the body.
struct http_reply {
  int status = 0;
  std::string head;
  std::string body;
};

/// A non-blocking socket connecting to 127.0.0.1:`port`; -1 on failure.
int open_loopback(uint16_t port);

/// Sends `request` bytes as they are (reading meanwhile, so an early answer is heard) and reads
/// until the server closes or `limit` passes; nothing when no HTTP answer came.
std::optional<http_reply> http_talk(uint16_t port, const std::string& request,
                                    std::chrono::milliseconds limit = std::chrono::seconds(5));

/// `GET path` with `Connection: close`.
std::optional<http_reply> http_get(uint16_t port, const std::string& path,
                                   std::chrono::milliseconds limit = std::chrono::seconds(5));

} // namespace starling::testing
