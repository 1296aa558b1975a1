#include "actors/transfer/socket_io.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <netinet/in.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <capnp/message.h>

#include "actors/transfer/shm_ring.hpp"
#include "kernels/compress/codec.hpp"
#include "messages/wire.hpp"

namespace starling::actors::transfer {

std::string errno_text(const char* what) {
  return std::string{what} + ": " + std::strerror(errno);
}

void set_timeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

status set_congestion_control(int fd, const std::string& name) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                   static_cast<socklen_t>(name.size()))
      != 0)
    return fail(errno_text(("TCP congestion control '" + name + "'").c_str()));
  return {};
}

std::string congestion_control_of(int fd) {
  char name[32] = {};
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0)
    return {};
  return std::string{name, ::strnlen(name, len)};
}

bool congestion_control_name(const std::string& name) {
  // At most 15 characters: TCP_CA_NAME_MAX is 16 with the NUL.
  return !name.empty() && name.size() <= 15
         && std::all_of(name.begin(), name.end(), [](char c) {
              return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
            });
}

std::string check_congestion_control(const std::string& name) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errno_text("socket");
  auto st = set_congestion_control(fd, name);
  ::close(fd);
  return st ? std::string{} : st.what();
}

status send_all(int fd, const void* data, size_t n, int flags) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    auto r = ::send(fd, p, n, flags | MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return fail("timed out writing to the data connection");
    if (r <= 0)
      return fail(errno_text("writing to the data connection"));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return {};
}

namespace {

/// Why a read that returned `r` (0, or < 0 with errno other than EINTR) after `got` of `n`
/// bytes ended.
status read_ended(ssize_t r, size_t got, size_t n, const char* reading) {
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return fail("timed out after " + std::to_string(got) + " of " + std::to_string(n) +
                " bytes");
  if (r == 0)
    return fail("the peer closed the connection after " + std::to_string(got) + " of " +
                std::to_string(n) + " bytes");
  return fail(errno_text(reading));
}

} // namespace

status recv_all(int fd, void* data, size_t n, size_t& got) {
  auto* p = static_cast<char*>(data);
  got = 0;
  while (got < n) {
    auto r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return read_ended(r, got, n, "reading from the data connection");
    got += static_cast<size_t>(r);
  }
  return {};
}

namespace {

bool parse_ipv4(const std::string& host, uint16_t port, sockaddr_in& addr) {
  addr = sockaddr_in{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  auto text = host == "localhost" ? std::string{"127.0.0.1"} : host;
  return ::inet_pton(AF_INET, text.c_str(), &addr.sin_addr) == 1;
}

/// A TCP socket for the IPv4 literal `host` and `port` (parsed into `addr`); -1 with `why` set.
int open_ipv4(const std::string& host, uint16_t port, sockaddr_in& addr, std::string& why) {
  if (!parse_ipv4(host, port, addr)) {
    why = "not an IPv4 address: " + host;
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    why = errno_text("socket");
  return fd;
}

} // namespace

int connect_ipv4(const std::string& host, uint16_t port, int send_buffer, std::string& why,
                 std::chrono::milliseconds timeout) {
  sockaddr_in addr;
  int fd = open_ipv4(host, port, addr, why);
  if (fd < 0)
    return -1;
  if (send_buffer > 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
  auto where = "connect to " + host + ":" + std::to_string(port);
  if (timeout.count() <= 0) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      why = errno_text(where.c_str());
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // Non-blocking connect bounded by `timeout` (a host that drops SYNs would otherwise hold the
  // thread for the kernel's ~2 minutes of retries).
  auto flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINPROGRESS) {
      why = errno_text(where.c_str());
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int r = 0;
    do
      r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    while (r < 0 && errno == EINTR);
    int err = 0;
    socklen_t len = sizeof err;
    if (r == 0) {
      why = where + ": timed out";
      ::close(fd);
      return -1;
    }
    if (r < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      errno = err != 0 ? err : errno;
      why = errno_text(where.c_str());
      ::close(fd);
      return -1;
    }
  }
  ::fcntl(fd, F_SETFL, flags);
  return fd;
}

int listen_ipv4(const std::string& host, uint16_t port, uint16_t& bound, std::string& why) {
  sockaddr_in addr;
  int fd = open_ipv4(host, port, addr, why);
  if (fd < 0)
    return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    why = errno_text(("listen on " + host + ":" + std::to_string(port)).c_str());
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  bound = ntohs(addr.sin_port);
  return fd;
}

namespace {

/// The address of the abstract-namespace Unix socket `name`; false when it is too long.
bool local_address(const std::string& name, sockaddr_un& addr, socklen_t& len) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof addr.sun_path)
    return false;
  addr.sun_path[0] = '\0'; // abstract: no file, gone with the socket
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return true;
}

} // namespace

namespace {

/// A Unix stream socket for `name` and its address; -1 with `why` when either fails.
int local_socket(const std::string& name, sockaddr_un& addr, socklen_t& len, std::string& why) {
  if (!local_address(name, addr, len)) {
    why = "a local socket name of " + std::to_string(name.size()) + " bytes";
    return -1;
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    why = errno_text("socket");
  return fd;
}

} // namespace

int listen_local(const std::string& name, std::string& why) {
  sockaddr_un addr;
  socklen_t len = 0;
  int fd = local_socket(name, addr, len, why);
  if (fd < 0)
    return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    why = errno_text(("listen on the local socket " + name).c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

int connect_local(const std::string& name, std::string& why) {
  sockaddr_un addr;
  socklen_t len = 0;
  int fd = local_socket(name, addr, len, why);
  if (fd < 0)
    return -1;
  int r = 0;
  do
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    why = errno_text(("connect to the local socket " + name).c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

bool same_user(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred)
    return false;
  return cred.uid == ::geteuid();
}

void set_send_buffer(int fd, int bytes) {
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

status send_with_fd(int fd, const void* data, size_t n, int pass) {
  if (pass < 0)
    return send_all(fd, data, n);
  iovec iov{const_cast<void*>(data), n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  auto* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass, sizeof pass);
  ssize_t r = 0;
  do
    r = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r <= 0)
    return fail(errno_text("writing to the local link"));
  auto sent = static_cast<size_t>(r);
  return send_all(fd, static_cast<const char*>(data) + sent, n - sent);
}

status recv_with_fd(int fd, void* data, size_t n, int& passed) {
  passed = -1;
  auto* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    iovec iov{p + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    auto r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return read_ended(r, got, n, "reading from the local link");
    for (auto* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      auto count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f = -1;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
        if (passed < 0)
          passed = f;
        else
          ::close(f);
      }
    }
    got += static_cast<size_t>(r);
  }
  return {};
}

acceptor::acceptor(int listen_fd, uint32_t max_connections, serve_fn serve, refused_fn refused)
  : listen_fd_(listen_fd), max_(max_connections), serve_(std::move(serve)),
    refused_(std::move(refused)) {
  thread_ = std::thread([this] { loop(); });
}

acceptor::~acceptor() { stop(); }

void acceptor::stop() {
  {
    std::lock_guard<std::mutex> guard{mu_};
    if (stopped_)
      return;
    stopped_ = true;
    for (auto& c : conns_)
      if (!c.done) // a done connection's fd is closed and its number may be reused
        ::shutdown(c.fd, SHUT_RDWR);
  }
  ::shutdown(listen_fd_, SHUT_RDWR); // wakes accept()
  if (thread_.joinable())
    thread_.join();
  ::close(listen_fd_);
  std::list<conn> rest;
  {
    std::lock_guard<std::mutex> guard{mu_};
    rest.swap(conns_);
  }
  for (auto& c : rest)
    if (c.thread.joinable())
      c.thread.join();
}

void acceptor::loop() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    std::string refusal;
    {
      std::list<conn> finished;
      std::lock_guard<std::mutex> guard{mu_};
      // Reap finished connection threads: they set `done` last, so joining them is immediate.
      for (auto i = conns_.begin(); i != conns_.end();) {
        if (i->done)
          finished.splice(finished.end(), conns_, i++);
        else
          ++i;
      }
      for (auto& c : finished)
        c.thread.join();
      if (stopped_) {
        if (fd >= 0)
          ::close(fd);
        return;
      }
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED)
          continue;
        return; // the socket is unusable: no more connections
      }
      if (conns_.size() >= max_) {
        ::close(fd);
        refusal = "refused a connection: " + std::to_string(conns_.size()) + " open";
      } else {
        conns_.emplace_back();
        auto it = std::prev(conns_.end());
        it->fd = fd;
        it->thread = std::thread([this, it] {
          serve_(it->fd);
          std::lock_guard<std::mutex> guard{mu_};
          ::close(it->fd);
          it->done = true;
        });
      }
    }
    if (!refusal.empty() && refused_)
      refused_(std::move(refusal));
  }
}

buffer_pool::block buffer_pool::take(size_t n) {
  {
    std::lock_guard<std::mutex> guard{mu_};
    auto best = free_.end();
    for (auto i = free_.begin(); i != free_.end(); ++i)
      if (i->capacity >= n && (best == free_.end() || i->capacity < best->capacity))
        best = i;
    if (best != free_.end()) {
      auto b = std::move(*best);
      free_.erase(best);
      return b;
    }
  }
  return block{std::unique_ptr<char[]>(new char[std::max<size_t>(n, 8)]), n};
}

void buffer_pool::set_keep(size_t keep) {
  std::lock_guard<std::mutex> guard{mu_};
  keep_ = keep;
}

void buffer_pool::give(block b) {
  std::lock_guard<std::mutex> guard{mu_};
  free_.push_back(std::move(b));
  while (free_.size() > keep_) {
    // Drop the smallest: large transfers are the ones whose fresh pages cost.
    auto smallest = std::min_element(free_.begin(), free_.end(), [](auto& x, auto& y) {
      return x.capacity < y.capacity;
    });
    free_.erase(smallest);
  }
}

status decode_pooled(const std::shared_ptr<buffer_pool>& pool, buffer_pool::block b,
                     size_t length,
                     const std::function<status(const kernels::tensor_header&)>& check,
                     messages::tensor_msg& out) {
  bool alias = false;
  size_t offset = 0;
  kernels::tensor_header header;
  auto st = messages::read_flat(b.data.get(), length, [&](capnp::MessageReader& reader) -> status {
    messages::tensor_view view;
    if (auto st = messages::read_tensor(reader.getRoot<wire::Tensor>(), view); !st)
      return st;
    auto& h = view.header;
    if (check)
      if (auto st = check(h); !st)
        return st;
    const char* base = b.data.get();
    auto* data = reinterpret_cast<const char*>(view.data);
    if (h.codec == kernels::codec_id::none && h.dtype == kernels::wire_dtype::float32 &&
        view.gathered.empty() && view.size > 0 &&
        reinterpret_cast<uintptr_t>(data) % alignof(float) == 0 && data >= base &&
        data + view.size <= base + length) {
      alias = true;
      offset = static_cast<size_t>(data - base);
      header = h;
      return {};
    }
    if (h.dtype == kernels::wire_dtype::float32) {
      // A compressed fp32 payload decodes into another pooled buffer: fresh pages for every
      // decoded chunk made decoding ~50x slower than the codec itself (bench_codecs "dec new").
      auto n = kernels::checked_numel(h.shape);
      if (!n)
        return n.error();
      auto bytes = static_cast<size_t>(*n) * sizeof(float);
      auto owner = std::make_shared<buffer_pool::block>(pool->take(bytes));
      auto t = at::from_blob(
        owner->data.get(), h.shape,
        [pool, owner](void*) mutable {
          pool->give(std::move(*owner));
          owner.reset();
        },
        at::TensorOptions().dtype(at::kFloat));
      if (auto st = kernels::decode_into(h, view.data, view.size, t); !st)
        return st;
      out.tensor = std::move(t);
      out.codec = h.codec;
      out.params = h.params;
      return {};
    }
    auto t = kernels::decode_payload(h, view.data, view.size);
    if (!t)
      return fail(t.error().what);
    out.tensor = std::move(*t);
    out.codec = h.codec;
    out.params = h.params;
    return {};
  });
  if (!st || !alias) {
    pool->give(std::move(b));
    return st;
  }
  try {
    auto* data = b.data.get() + offset;
    auto owner = std::make_shared<buffer_pool::block>(std::move(b));
    out.tensor = at::from_blob(
      data, header.shape,
      [pool, owner](void*) mutable {
        pool->give(std::move(*owner));
        owner.reset();
      },
      at::TensorOptions().dtype(at::kFloat));
    out.codec = header.codec;
    out.params = header.params;
    return {};
  } catch (const std::exception& e) {
    return fail(std::string{"decode failed: "} + e.what());
  }
}

status decode_ring(const std::shared_ptr<ring_reader>& ring, uint64_t pos, size_t length,
                   const std::shared_ptr<buffer_pool>& pool,
                   const std::function<status(const kernels::tensor_header&)>& check,
                   messages::tensor_msg& out) {
  // `pos` was claimed: `length` bytes lie contiguously there, inside the mapping.
  const uint8_t* src = ring->ring().at(pos);
  auto copy_out = [&]() -> status {
    auto b = pool->take(length);
    std::memcpy(b.data.get(), src, length);
    ring->release(pos);
    return decode_pooled(pool, std::move(b), length, check, out);
  };
  // The segment table, copied: the peer may change the ring's bytes while they are read.
  constexpr uint32_t max_segments = 512; // Cap'n Proto's own limit
  if (ring->zeros() == nullptr || length < 8 || length % 8 != 0)
    return copy_out();
  uint32_t first = 0;
  std::memcpy(&first, src, 4);
  if (first >= max_segments)
    return copy_out();
  size_t count = size_t{first} + 1;
  size_t table_bytes = 4 * ((count + 2) & ~size_t{1});
  if (table_bytes > length)
    return copy_out();
  std::vector<uint32_t> table(table_bytes / 4);
  std::memcpy(table.data(), src, table_bytes);
  // Small segments (the message's structure) are copied; large ones (bulk data) are parsed as
  // zero pages at the same offsets, so the parser reads nothing the peer can change, and a
  // payload found inside one is then read from the ring at that offset.
  constexpr size_t copy_limit = size_t{4} << 10;
  size_t offset = table_bytes;
  size_t copied = 0;
  for (size_t i = 0; i < count; ++i) {
    auto bytes = size_t{table[i + 1]} * sizeof(capnp::word);
    if (bytes > length - offset)
      return copy_out();
    if (bytes <= copy_limit)
      copied += bytes;
    offset += bytes;
  }
  if (offset != length)
    return copy_out();
  std::vector<capnp::word> small(copied / sizeof(capnp::word));
  std::vector<kj::ArrayPtr<const capnp::word>> segs;
  offset = table_bytes;
  copied = 0;
  for (size_t i = 0; i < count; ++i) {
    auto words = size_t{table[i + 1]};
    auto bytes = words * sizeof(capnp::word);
    if (bytes <= copy_limit) {
      std::memcpy(reinterpret_cast<char*>(small.data()) + copied, src + offset, bytes);
      segs.push_back(kj::arrayPtr(small.data() + copied / sizeof(capnp::word), words));
      copied += bytes;
    } else {
      segs.push_back(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(ring->zeros() + offset), words));
    }
    offset += bytes;
  }
  size_t data_offset = 0;
  kernels::tensor_header header;
  bool alias = false;
  try {
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 4 * (length / sizeof(capnp::word)) + 1024;
    capnp::SegmentArrayMessageReader reader(kj::arrayPtr(segs.data(), segs.size()), opts);
    messages::tensor_view view;
    if (messages::read_tensor(reader.getRoot<wire::Tensor>(), view).ok()) {
      auto& h = view.header;
      auto* data = view.data;
      if (h.codec == kernels::codec_id::none && h.dtype == kernels::wire_dtype::float32 &&
          view.gathered.empty() && view.size > 0 && data >= ring->zeros() &&
          data + view.size <= ring->zeros() + length &&
          reinterpret_cast<uintptr_t>(src + (data - ring->zeros())) % alignof(float) == 0) {
        alias = true;
        data_offset = static_cast<size_t>(data - ring->zeros());
        header = h;
      }
    }
  } catch (const kj::Exception&) {
    alias = false; // the copy's decoder gives the authoritative answer
  }
  if (!alias)
    return copy_out();
  if (check)
    if (auto st = check(header); !st) {
      ring->release(pos);
      return st;
    }
  try {
    out.tensor = at::from_blob(
      const_cast<uint8_t*>(src + data_offset), header.shape,
      [ring, pos](void*) { ring->release(pos); }, at::TensorOptions().dtype(at::kFloat));
  } catch (const std::exception& e) {
    ring->release(pos);
    return fail(std::string{"decode failed: "} + e.what());
  }
  out.codec = header.codec;
  out.params = header.params;
  return {};
}

} // namespace starling::actors::transfer
