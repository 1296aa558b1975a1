// A direct data channel for bulk tensor bytes between two nodes on one host: the control plane
// stays in actors (BASP), the payload streams over its own loopback TCP connection.
//
// Why: BASP moves a big payload through several copies (serializer buffer, the multiplexer's
// write buffer, the reader's buffer, the deserialized vector) on CAF's single I/O thread, and a
// one-message transfer faults in fresh pages for each copy (CAF-NOTES, pitfall 7). Measured on
// this shared 2-core machine with `bench_transfer 5` (six runs at load 2.6-4.3, medians of the
// per-run "% of raw TCP"; raw TCP itself swung 1.4-4.1 GB/s between runs): one 16 MiB message
// ~9%, BASP chunks (4 MiB, window 4) ~53% at 16 MiB and ~12% at 64 MiB (the credit waits
// stall; window 8 did not help in one run), the direct channel ~82% at 16 MiB (median 1.87
// GB/s) and ~91% at 64 MiB. The sender writes the Cap'n Proto message straight from the
// tensor's storage into the socket (fp32 with codec `none` is referenced, not copied:
// messages::encode_tensor_source); the receiver reads into a pooled buffer that becomes the
// tensor's storage (no decode copy, no fresh pages). Its weak spot is small tensors: each
// transfer pays an announcement round trip over BASP, a new TCP connection and a thread start
// (~1 ms), so 1 MiB reaches only ~18%; a pool of open connections would fix that.
//
// Why a small socket thread per connection rather than a CAF `io::broker`: a broker reads into
// CAF's own buffer and hands it over in `new_data_msg` (one more copy, on the multiplexer thread
// shared with BASP), and a broker write is a copy into the scribe's write buffer; CAF-NOTES
// measured a paced broker stream at ~75% of raw TCP. Blocking send/recv on a dedicated thread
// moves the bytes exactly once per side, like the raw TCP baseline. The threads never touch
// actor state: they look up one-time tokens in a mutex-protected table and `anon_send` the
// decoded tensor to the sink.
//
// Protocol. The receiver's data endpoint listens on IPv4 loopback only (127.0.0.0/8; anything
// else is refused when opening and when a sender is told to connect). A transfer:
//   1. sender → receiver actor (BASP): `direct_announce{token, total_bytes, dtype, shape, codec}`
//      with a fresh 16-byte random token; the receiver checks the size against
//      `receiver_options::max_bytes`, remembers the announcement for `announce_ttl` and replies
//      `direct_endpoint{host, port}` (port 0: no endpoint → the sender uses BASP chunks).
//   2. sender → data endpoint (TCP): a 32-byte frame header (see `frame_header`) followed by
//      exactly `length` bytes of the encoded Cap'n Proto `Tensor` (messages/tensor.capnp).
//   3. The receiver checks the token (one-time, unexpired), that `length` equals the announced
//      size, reads the bytes (at most `io_timeout` without progress), decodes them with the
//      hardened decoder, checks dtype/shape/codec against the announcement, sends the
//      `tensor_msg` to the sink and answers on the connection with a status frame: a 32-bit
//      little-endian length and that many bytes of error text (length 0: delivered).
// The sender falls back to BASP chunks when the receiver has no data endpoint, does not know
// `direct_announce`, or the connection cannot be made; its reply (`transfer_report`) names the
// path taken. Any failure after the connection was made is an error, and nothing is delivered.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/transfer/chunked.hpp"
#include "actors/transfer/frame.hpp"
#include "kernels/result.hpp"

namespace starling::actors::transfer {

/// Settings of a data endpoint.
struct data_channel_options {
  /// Address to listen on; must be IPv4 loopback (127.0.0.0/8 or "localhost").
  std::string host = "127.0.0.1";
  /// Port; 0 lets the OS choose.
  uint16_t port = 0;
  /// Longest wait for progress on a connection (header, payload bytes, status write).
  std::chrono::milliseconds io_timeout{10000};
  /// How long an announced transfer waits for its connection before the token expires.
  std::chrono::milliseconds announce_ttl{30000};
  /// Connections served at once; more are closed at once (the sender reports an error).
  uint32_t max_connections = 16;
  /// Receive buffers kept for reuse once their tensors are freed.
  uint32_t pool_buffers = 4;
};

/// A listening data endpoint with its connection threads and receive-buffer pool, shared by the
/// receivers of one node. Thread-safe.
class data_endpoint {
public:
  /// Opens the endpoint; fails on a non-loopback host or when the port cannot be bound.
  static result<std::shared_ptr<data_endpoint>> open(const data_channel_options& opts);

  virtual ~data_endpoint() = default;

  /// The loopback address it listens on.
  virtual const std::string& host() const = 0;
  /// The port it listens on.
  virtual uint16_t port() const = 0;
  /// Transfers delivered to a sink so far.
  virtual uint64_t delivered() const = 0;
  /// Transfers refused or failed so far (bad token or length, timeout, truncation, decode).
  virtual uint64_t failed() const = 0;
  /// The most recent failure, for logs and tests.
  virtual std::string last_error() const = 0;
  /// Closes the listening socket and every connection, joins the threads and forgets pending
  /// announcements. Idempotent; the owner must call it before its actor system shuts down.
  virtual void stop() = 0;
};

/// Settings of a transfer sender.
struct direct_sender_options {
  /// The BASP chunk path used as fallback.
  chunked_options chunks;
  /// Longest wait for progress on the data connection (send and the receiver's status).
  std::chrono::milliseconds io_timeout{10000};
  /// Longest wait for the receiver's answer to an announcement.
  std::chrono::milliseconds announce_timeout{30000};
};

/// Spawns a receiver that takes direct transfers on `endpoint` (null: none, every sender falls
/// back to chunks) and BASP chunks, and sends each `messages::tensor_msg` to `sink`. It also
/// answers `(get_atom) -> messages::direct_endpoint`. Publish it for remote senders.
caf::actor spawn_direct_receiver(caf::actor_system& sys, caf::actor sink,
                                 std::shared_ptr<data_endpoint> endpoint,
                                 receiver_options opts = {});

/// Spawns a sender. It answers `(transfer_atom, messages::tensor_msg, caf::actor receiver)` with
/// a `messages::transfer_report` once the receiver decoded the tensor (path "direct", or
/// "chunked" with the reason of the fallback), or with an error.
caf::actor spawn_direct_sender(caf::actor_system& sys, direct_sender_options opts = {});

} // namespace starling::actors::transfer
