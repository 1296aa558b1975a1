// Tensor transfers over the direct transport (transport.hpp): the control plane stays in actors
// (BASP), the bytes travel on a pooled direct link.
//
// Why: BASP moves a big payload through several copies on CAF's single I/O thread (CAF-NOTES,
// pitfall 7); the transport writes the encoded tensor straight from its storage and reads it into
// a pooled buffer that becomes the tensor. Links stay open, so a transfer to a node this node
// sent to before pays no connection and no thread start (the former data channel opened a
// connection and a thread per transfer: 1 MiB reached only ~18% of raw TCP).
//
// Protocol. A transfer:
//   1. sender -> receiver actor (BASP): `direct_announce{token, total_bytes, dtype, shape, codec}`
//      with a fresh 16-byte random token; the receiver checks the size against
//      `receiver_options::max_bytes`, remembers the announcement for `announce_ttl` (the token
//      also opens a link once, for a sender that has none to this node yet) and replies
//      `direct_endpoint{host, port}` of its node's transport (port 0: no endpoint -> the sender
//      uses BASP chunks).
//   2. sender -> receiver's transport: a frame on `transfer_channel` (meta: the token; payload:
//      the encoded Cap'n Proto `Tensor`), on the link to `host:port`, opened if need be.
//   3. The receiver checks the token (one-time, unexpired), that the payload's length equals the
//      announced size, decodes it with the hardened decoder, checks dtype/shape/codec against the
//      announcement, sends the `tensor_msg` to the sink and answers on the same link with a frame
//      on `transfer_status_channel` (the token and "" when delivered, else the reason). A refused
//      transfer's bytes are read and dropped; the link stays open for the next one.
// The sender falls back to BASP chunks when the receiver has no endpoint, does not know
// `direct_announce`, or the link cannot be opened; its reply (`transfer_report`) names the path
// taken. Any failure after the link was open is an error, and nothing is delivered.
//
// Stage state downloads move to the same path: the donor answers `(get_atom, state_atom, ...)`
// with the state's metadata and sends each tensor with this sender to the fetcher's receiver
// (the receivers of one node share its endpoint), instead of one BASP message per part.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/transfer/chunked.hpp"
#include "actors/transfer/link_frame.hpp"
#include "actors/transfer/transport.hpp"
#include "kernels/result.hpp"

namespace starling::actors::transfer {

/// Settings of a data endpoint that opens its own transport.
struct data_channel_options {
  /// IPv4 address to listen on (the node's address; "localhost" = 127.0.0.1). Empty: client
  /// mode (sends, receives on links it opened, accepts no connections).
  std::string host = "127.0.0.1";
  /// Port; 0 lets the OS choose.
  uint16_t port = 0;
  /// Longest wait for progress on a link (a frame's bytes, a write, a connect).
  std::chrono::milliseconds io_timeout{10000};
  /// How long an announced transfer waits for its frame before the token expires.
  std::chrono::milliseconds announce_ttl{30000};
  /// Links accepted at once; more are closed at once.
  uint32_t max_connections = 64;
  /// Receive buffers kept for reuse once their tensors are freed, on top of the ones the open
  /// links can hold at once (transport_options::pool_buffers).
  uint32_t pool_buffers = 4;
  /// Seals the links (a closed run); null: plaintext (transport_options::security).
  std::shared_ptr<const link_security> security;
  /// TCP congestion control of the links (transport_options::congestion_control; empty: the
  /// system's).
  std::string congestion_control = "cubic";
};

/// A node's transfer endpoint: its transport with the transfer channels installed, shared by the
/// node's receivers and senders. Thread-safe.
class data_endpoint {
public:
  /// Opens a transport with `opts` and installs the transfer channels on it.
  static result<std::shared_ptr<data_endpoint>> open(const data_channel_options& opts);
  /// Installs the transfer channels on an open transport (shared with other users, e.g. the
  /// node's averagers).
  static std::shared_ptr<data_endpoint> on(std::shared_ptr<transport> t,
                                           const data_channel_options& opts = {});

  virtual ~data_endpoint() = default;

  /// The transport underneath.
  virtual const std::shared_ptr<transport>& link_layer() const = 0;
  /// The address and port receivers announce (port 0: client mode).
  virtual const std::string& host() const = 0;
  virtual uint16_t port() const = 0;
  /// Transfers delivered to a sink so far.
  virtual uint64_t delivered() const = 0;
  /// Transfers refused or failed so far (bad token or length, mismatching header, decode), and
  /// links closed for malformed frames.
  virtual uint64_t failed() const = 0;
  /// The most recent failure, for logs and tests.
  virtual std::string last_error() const = 0;
  /// Stops the transport (when this endpoint opened it) and forgets pending announcements.
  /// Idempotent; the owner must call it before its actor system shuts down.
  virtual void stop() = 0;
};

/// Settings of a transfer sender.
struct direct_sender_options {
  /// The BASP chunk path used as fallback.
  chunked_options chunks;
  /// The endpoint whose link pool the sender uses; null: the sender opens a client-mode one of
  /// its own (stopped when the sender exits).
  std::shared_ptr<data_endpoint> endpoint;
  /// Longest wait for progress on a link.
  std::chrono::milliseconds io_timeout{10000};
  /// Longest wait for the receiver's answer to an announcement.
  std::chrono::milliseconds announce_timeout{30000};
};

/// Spawns a receiver that takes direct transfers on `endpoint` (null or client mode: none, every
/// sender falls back to chunks) and BASP chunks, and sends each `messages::tensor_msg` to `sink`.
/// It also answers `(get_atom) -> messages::direct_endpoint`. Publish it for remote senders.
caf::actor spawn_direct_receiver(caf::actor_system& sys, caf::actor sink,
                                 std::shared_ptr<data_endpoint> endpoint,
                                 receiver_options opts = {});

/// Spawns a sender. It answers `(transfer_atom, messages::tensor_msg, caf::actor receiver)` with
/// a `messages::transfer_report` once the receiver decoded the tensor (path "direct", or
/// "chunked" with the reason of the fallback), or with an error.
caf::actor spawn_direct_sender(caf::actor_system& sys, direct_sender_options opts = {});

} // namespace starling::actors::transfer
