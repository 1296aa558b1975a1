// Blocking socket helpers and the pooled receive buffers of the direct transport
// (transport.hpp), whose threads run beside BASP. No actor state is touched here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::actors::transfer {

class ring_reader;

/// `what: strerror(errno)`.
std::string errno_text(const char* what);

/// Sets the send and receive timeouts (no progress for `t` fails a call) and TCP_NODELAY.
void set_timeouts(int fd, std::chrono::milliseconds t);

/// Sets the TCP congestion control of `fd` to `name` (e.g. "cubic"); fails when the kernel has
/// no such algorithm or does not let this process choose it.
status set_congestion_control(int fd, const std::string& name);
/// The TCP congestion control `fd` uses (empty when it cannot be read, e.g. not a TCP socket).
std::string congestion_control_of(int fd);
/// True when `name` can be a kernel's congestion control name (1-15 of a-z, 0-9 and _).
bool congestion_control_name(const std::string& name);
/// Whether this process can give TCP sockets the algorithm `name`: empty when it can, else the
/// kernel's refusal.
std::string check_congestion_control(const std::string& name);

/// Sends all `n` bytes; fails on a timeout (no progress for the socket's send timeout) or error.
status send_all(int fd, const void* data, size_t n, int flags = 0);

/// Receives exactly `n` bytes; `got` says how many came before a failure.
status recv_all(int fd, void* data, size_t n, size_t& got);

/// Connects a TCP socket to the IPv4 literal `host` ("localhost" = 127.0.0.1) and `port` with a
/// send buffer of `send_buffer` bytes (0: the kernel's default), waiting at most `timeout` for
/// the connection (0: the kernel's own limit). -1 with `why` set on failure.
int connect_ipv4(const std::string& host, uint16_t port, int send_buffer, std::string& why,
                 std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

/// Opens a listening TCP socket on the IPv4 literal `host` and `port` (0: any free port) and
/// stores the port it got in `bound`. -1 with `why` set on failure.
int listen_ipv4(const std::string& host, uint16_t port, uint16_t& bound, std::string& why);

/// Opens a listening Unix stream socket on the abstract-namespace `name` (no file; visible only
/// inside this network namespace). -1 with `why` set on failure (e.g. the name is taken).
int listen_local(const std::string& name, std::string& why);

/// Connects a Unix stream socket to the abstract-namespace `name`. -1 with `why` set when
/// nothing listens there.
int connect_local(const std::string& name, std::string& why);

/// True when the process at the other end of the Unix socket `fd` runs as this process's
/// effective user (who could read this process's memory anyway).
bool same_user(int fd);

/// Sets the send buffer of `fd` to `bytes` (beyond the system's cap when privileged).
void set_send_buffer(int fd, int bytes);

/// Sends all `n` bytes on the Unix socket `fd`, the first ones with a copy of the descriptor
/// `pass` (none when negative).
status send_with_fd(int fd, const void* data, size_t n, int pass);

/// Receives exactly `n` bytes from the Unix socket `fd` and the first descriptor that came with
/// them in `passed` (-1 when none; any others are closed).
status recv_with_fd(int fd, void* data, size_t n, int& passed);

/// A listening socket's accept thread with one thread per accepted connection. Finished
/// connection threads are reaped as new connections arrive; beyond `max_connections` open ones a
/// new connection is closed at once and reported. Thread-safe.
class acceptor {
public:
  /// Serves one connection on its own thread; the socket is closed after it returns.
  using serve_fn = std::function<void(int fd)>;
  /// Told why a connection was refused (called without the acceptor's lock).
  using refused_fn = std::function<void(std::string)>;

  /// Takes ownership of `listen_fd` and starts accepting.
  acceptor(int listen_fd, uint32_t max_connections, serve_fn serve, refused_fn refused);
  ~acceptor();
  acceptor(const acceptor&) = delete;
  acceptor& operator=(const acceptor&) = delete;

  /// Shuts the listening socket and every open connection down, joins every thread and closes
  /// the listening socket. Idempotent.
  void stop();

private:
  struct conn {
    int fd = -1;
    bool done = false;
    std::thread thread;
  };
  void loop();

  int listen_fd_;
  uint32_t max_;
  serve_fn serve_;
  refused_fn refused_;
  std::mutex mu_;
  bool stopped_ = false;
  std::list<conn> conns_;
  std::thread thread_;
};

/// Reused receive buffers: a transfer takes the smallest free buffer that fits, and an aliasing
/// tensor gives its buffer back when freed, so steady traffic touches no fresh pages. Thread-safe.
class buffer_pool {
public:
  struct block {
    std::unique_ptr<char[]> data; // from operator new[]: 16-byte aligned, never zero-filled
    size_t capacity = 0;
  };

  /// Keeps at most `keep` free buffers.
  explicit buffer_pool(uint32_t keep) : keep_(keep) {}

  /// Keeps at most `keep` free buffers from now on (the surplus goes at the next `give`).
  void set_keep(size_t keep);

  /// A buffer of at least `n` bytes.
  block take(size_t n);
  /// Returns a buffer (the smallest free one is dropped beyond `keep`).
  void give(block b);

private:
  std::mutex mu_;
  std::vector<block> free_;
  size_t keep_;
};

/// Decodes `length` untrusted bytes of `b` (a Cap'n Proto `Tensor`) into `out` after `check`
/// accepted the header. An fp32 `none` payload aliases the buffer, which returns to `pool` when
/// the tensor is freed; otherwise the buffer returns at once.
status decode_pooled(const std::shared_ptr<buffer_pool>& pool, buffer_pool::block b,
                     size_t length,
                     const std::function<status(const kernels::tensor_header&)>& check,
                     messages::tensor_msg& out);

/// Decodes the claimed payload of `length` bytes at `pos` of a peer's ring (shm_ring.hpp) into
/// `out` after `check` accepted the header. The peer can write its ring at any time, so the
/// message's structure is parsed from copies only (its bulk segments as zero pages); an fp32
/// `none` payload is then read in place and holds its region until the tensor is freed, any
/// other is copied out into a pooled buffer and decoded there (its region released at once).
status decode_ring(const std::shared_ptr<ring_reader>& ring, uint64_t pos, size_t length,
                   const std::shared_ptr<buffer_pool>& pool,
                   const std::function<status(const kernels::tensor_header&)>& check,
                   messages::tensor_msg& out);

} // namespace starling::actors::transfer
