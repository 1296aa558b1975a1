#include "support/http_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace starling::testing {

using steady = std::chrono::steady_clock;

int open_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::optional<http_reply> http_talk(uint16_t port, const std::string& request,
                                    std::chrono::milliseconds limit) {
  auto deadline = steady::now() + limit;
  int fd = open_loopback(port);
  if (fd < 0)
    return std::nullopt;
  size_t sent = 0;
  bool sending = true;
  std::string got;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0)
      break;
    pollfd p{fd, static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      break;
    if (p.revents & POLLIN) {
      char buf[65536];
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0)
        break;
      got.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (p.revents & (POLLERR | POLLHUP))
      break;
    if (sending && (p.revents & POLLOUT)) {
      auto n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) {
        sending = false; // the server stopped reading (it answered, or gave up on us)
        continue;
      }
      if (n > 0)
        sent += static_cast<size_t>(n);
      if (sent == request.size())
        sending = false;
    }
  }
  ::close(fd);
  if (got.rfind("HTTP/1.", 0) != 0 || got.size() < 12)
    return std::nullopt;
  http_reply r;
  r.status = std::atoi(got.c_str() + 9);
  auto end = got.find("\r\n\r\n");
  r.head = got.substr(0, end);
  if (end != std::string::npos)
    r.body = got.substr(end + 4);
  return r;
}

std::optional<http_reply> http_get(uint16_t port, const std::string& path,
                                   std::chrono::milliseconds limit) {
  return http_talk(
      port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", limit);
}

} // namespace starling::testing
