// A hand-written TCP client on loopback, for tests that feed hostile bytes to a listening
// endpoint (the transfer data channel, the averager's data plane).
#pragma once

#include <arpa/inet.h>
#include <cstddef>
#include <cstdint>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace starling::testing {

struct raw_socket {
  int fd = -1;

  /// Connects to 127.0.0.1:`port` (the test fails if it cannot).
  explicit raw_socket(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~raw_socket() { ::close(fd); }
  raw_socket(const raw_socket&) = delete;
  raw_socket& operator=(const raw_socket&) = delete;

  /// Writes all `n` bytes, or stops quietly once the other end refused and closed.
  void write(const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      auto r = ::send(fd, c, n, MSG_NOSIGNAL);
      if (r <= 0)
        return;
      c += r;
      n -= static_cast<size_t>(r);
    }
  }

  /// True once the other end closed the connection (a read returns 0 or fails) within 10 s.
  bool closed_by_peer() {
    char c;
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return ::recv(fd, &c, 1, 0) <= 0;
  }
};

/// True when something accepts a TCP connection on 127.0.0.1:`port` now.
inline bool loopback_port_accepts(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

} // namespace starling::testing
