// The node's HTTP endpoint: `/` (the live page), `/status` (JSON) and `/metrics` (Prometheus
// text 0.0.4), served by cpp-httplib from a small pool of threads. Handlers only read the
// latest snapshot from a `snapshot_store` (never an actor), so a slow or hostile client can hold
// at most a worker, and only for a short read timeout.
//
// What httplib 0.11 allows against slow clients (it has per-read timeouts, but no request
// deadline and no connection cap): a connection that sends nothing is dropped after ~10 ms
// (keep-alive timeout 0), one that stalls inside its request after `read_timeout`, and every
// connection serves one request (no keep-alive). Connections wait FIFO for a worker, so a request
// waits at most about (connections ahead of it) x read_timeout / threads.
// tests/runtime/observe/http_server_test.cpp measures it with 50 clients sending a byte a second
// (and reconnecting when dropped): /status answered in at most ~0.5 s with 2 workers.
// Not covered, for want of a request deadline in httplib 0.11: a client that sends a byte more
// often than every `read_timeout` holds a worker for as long as it likes (two such clients sending
// a byte every 10 ms left /status unanswered for 5 s). Closing that needs a server of our own
// with a per-request deadline (a CAF io::broker or one poll loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/result.hpp"

namespace starling::runtime::observe {

class snapshot_store;

/// Where and how the endpoint serves.
struct http_options {
  /// Address to bind: loopback unless the user chooses another.
  std::string host = "127.0.0.1";
  /// 0: the OS chooses a free port (`http_server::port()` says which).
  uint16_t port = 0;
  /// Worker threads (1 or 2).
  size_t threads = 2;
  /// How long one read of a request may wait for bytes before the connection is dropped.
  std::chrono::milliseconds read_timeout{20};
  /// How long writing an answer may block.
  std::chrono::milliseconds write_timeout{1000};
};

/// A running endpoint; stops (and joins its threads) when destroyed.
class http_server {
public:
  /// Binds and starts serving `store` (checked: threads in [1, 2], a resolvable host, a free
  /// port); fails with the reason.
  static result<std::unique_ptr<http_server>> start(std::shared_ptr<const snapshot_store> store,
                                                    const http_options& opts);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The bound port.
  uint16_t port() const;
  /// `http://HOST:PORT/`.
  std::string url() const;
  /// Stops accepting, finishes the requests in hand, joins the threads (idempotent).
  void stop();

  struct impl;

private:
  explicit http_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace starling::runtime::observe
