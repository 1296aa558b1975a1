// The direct transport: one way to move bulk tensors between nodes beside BASP, used by the
// averager's chunks, tensor transfers (data_channel.hpp) and stage state downloads.
//
// Why beside BASP: over BASP a tensor is encoded into a buffer, copied by CAF's serializer, copied
// into the multiplexer's write buffer, read into CAF's buffer, deserialized and decoded, all on
// CAF's one I/O thread (CAF-NOTES, pitfall 7). Here a link's writer thread writes the tensor's
// bytes straight from its storage (fp32 `none` is referenced, not copied; a compressed payload is
// encoded once, on the first link that sends it, and shared by every link it goes to), and the
// reader reads into a pooled buffer that becomes the tensor.
//
// Links: a link is one TCP connection (or, between open-run transports on one host, one Unix
// socket: `transport_options::local_links`) to a peer transport and carries frames in both directions,
// so a peer that accepts no connections (client mode: no listener) still sends and receives over
// the links it opened. Links stay open (a pool keyed by the peer's transport id) until they fail
// or the transport stops: a transfer between two nodes that met before pays no connection and no
// thread start. The side that connects presents a one-time token that the other side issued
// (over BASP, to the peer it names); the link then counts as a link to that peer. In a closed
// run (`transport_options::security`) the link is sealed (link_crypto.hpp): after the token both
// sides prove their node keys in a signed handshake, each checks that the other's key is one its
// gate admitted, and every byte after it (frames, metas, payloads) travels in AEAD records of at
// most 1 MiB with a counter nonce per direction; a tampered, replayed or reordered record closes
// the link with a counted reason (`refusals`). Open runs keep plaintext links. Frames carry a
// channel (link_frame.hpp): a local user registers a `channel_handler` and tells its peers its
// channel over BASP.
//
// Everything read from a link is validated (link_frame.hpp, the hardened tensor decoder, size
// limits, the channel's own checks); a bad frame closes the link and delivers nothing more from
// it. Each link holds at most `link_buffers` delivered payloads that its handlers still keep:
// the reader reads no further (TCP then slows the sender) until one is freed.
//
// Threads: one acceptor (with one thread per accepted link, which reads it), and per link a
// writer thread (which, for a link this side opened, also connects and starts its reader). They
// never touch actor state: handlers are called on the reader threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "actors/transfer/link_frame.hpp"
#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::messages {
class chunk_source;
}

namespace starling::actors::auth {
class key_pair;
}

namespace starling::actors::transfer {

/// What seals a closed run's links (link_crypto.hpp): both sides prove their node keys, each
/// checks that the other's is admitted, and every byte after the handshake travels in
/// authenticated, encrypted records.
struct link_security {
  /// This node's identity key.
  std::shared_ptr<const auth::key_pair> key;
  /// The run's experiment id (part of the signed transcript).
  std::string experiment;
  /// Whether the node of a proven peer id (20 bytes) may use a link now: empty when it may,
  /// else the refusal's line (e.g. the node gate's). Called on link threads: thread-safe.
  std::function<std::string(const std::string& peer_id)> admit;
  /// Ciphers offered (link_crypto.hpp's bits); 0: what this machine has.
  uint8_t ciphers = 0;
};

/// Settings of a transport.
struct transport_options {
  /// IPv4 literal to listen on (the node's configured address; "localhost" = 127.0.0.1). Empty:
  /// client mode, no listener; links are opened by this side only and carry both directions.
  std::string host = "127.0.0.1";
  /// Port; 0 lets the OS choose.
  uint16_t port = 0;
  /// Longest wait for progress inside a frame, a preamble, a write or a connect.
  std::chrono::milliseconds io_timeout{10000};
  /// How long an issued token waits for its link.
  std::chrono::milliseconds token_ttl{60000};
  /// Accepted links at once; more are closed at once.
  uint32_t max_links = 64;
  /// Largest payload a frame may carry.
  uint64_t max_payload_bytes = link_max_payload_bytes;
  /// Receive buffers kept for reuse, on top of `link_buffers` per open link (what the links can
  /// hold delivered at once).
  uint32_t pool_buffers = 16;
  /// Delivered payloads of one link its handlers may hold at once (at least 1).
  uint32_t link_buffers = 2;
  /// Open runs: a listening transport also accepts links on a same-host Unix socket
  /// (`local_link_name`), and a link to a peer whose socket this side can reach, owned by this
  /// process's user, goes over it instead of TCP, its payloads through shared-memory rings
  /// (`ring_bytes`). Falls back to TCP when that socket is missing or refuses. Sealed links
  /// always use TCP: a payload read in place from a peer's ring can still be written by the
  /// peer while a handler holds it (as good as sending other values; never memory outside the
  /// ring), which a closed run's authenticated records rule out.
  bool local_links = true;
  /// Data bytes of the shared-memory ring each side of a same-host link writes its payloads of
  /// up to half that size into (shm_ring.hpp; a page multiple from 64 KiB to 256 MiB); 0: none,
  /// payloads cross the Unix socket. The default holds two of the averager's 1 MiB chunks.
  uint64_t ring_bytes = (uint64_t{2} << 20) + (uint64_t{64} << 10);
  /// TCP congestion control of this side's TCP links ("cubic" by default; empty: the system's).
  /// A round of the averager sends to and receives from every member of its group at once and
  /// lasts as long as its slowest flow: flows of a loss-based algorithm share a bottleneck
  /// evenly, BBR's do not (4 peers on 200 Mbit/s links, 16M floats, BBR the system's default:
  /// fp32 1.10x Gloo's round with BBR, 0.99x with cubic; 8-bit codes 0.28x and 0.25x). A name
  /// that is not an algorithm's fails `open`; one this kernel lacks or does not allow leaves the
  /// links on the system's algorithm (`congestion_control()` says which, `last_error()` why).
  std::string congestion_control = "cubic";
  /// Null: plaintext links authenticated by their one-time token only (open runs: loopback
  /// demos and tests). Set (a closed run): every link is sealed, and plaintext links are refused.
  std::shared_ptr<const link_security> security;
};

/// A payload to send: a tensor encoded on first use by whichever link sends it first, then shared
/// by every frame that carries it (a result chunk going to many peers is encoded once).
/// Thread-safe.
class outgoing_payload {
public:
  /// `values` encoded with `codec`; a codec that cannot encode them (e.g. fp16 out of range)
  /// falls back to `none`.
  outgoing_payload(at::Tensor values, kernels::codec_id codec = kernels::codec_id::none,
                   kernels::codec_params params = {});
  /// An encoded payload (a Cap'n Proto `Tensor`, see messages::encode_tensor_source).
  explicit outgoing_payload(std::shared_ptr<const messages::chunk_source> encoded);
  ~outgoing_payload();

  /// Encodes once; the same status for every caller.
  const status& encode();
  /// The encoded bytes; valid after a successful `encode`.
  const std::shared_ptr<const messages::chunk_source>& bytes() const { return bytes_; }

private:
  at::Tensor values_;
  kernels::codec_id codec_;
  kernels::codec_params params_;
  std::once_flag once_;
  status status_;
  std::shared_ptr<const messages::chunk_source> bytes_;
};

/// A frame to send: its channel, its meta body and an optional payload.
class outgoing_frame {
public:
  outgoing_frame(uint32_t channel, const std::vector<uint8_t>& body,
                 std::shared_ptr<outgoing_payload> payload = nullptr);
  /// A frame whose payload is `values` encoded with `codec` (its own payload object).
  outgoing_frame(uint32_t channel, const std::vector<uint8_t>& body, at::Tensor values,
                 kernels::codec_id codec = kernels::codec_id::none,
                 kernels::codec_params params = {});

  /// The frame's meta: channel and body.
  const std::vector<uint8_t>& meta() const { return meta_; }
  /// The payload, null when there is none.
  const std::shared_ptr<outgoing_payload>& payload() const { return payload_; }

private:
  std::vector<uint8_t> meta_;
  std::shared_ptr<outgoing_payload> payload_;
};

/// A local user of a channel. Called on the links' reader threads (never two calls at once for
/// one link, possibly at once for two links): keep it short and thread-safe.
class channel_handler {
public:
  virtual ~channel_handler() = default;
  /// A frame's meta body arrived from `peer`, `payload_bytes` follow. A failure refuses the frame
  /// (see `refused`).
  virtual status admit(const std::string& peer, const uint8_t* body, size_t size,
                       uint64_t payload_bytes);
  /// Checks the payload's tensor header before it is decoded (same frame as `admit`).
  virtual status check(const std::string& peer, const uint8_t* body, size_t size,
                       const kernels::tensor_header& header);
  /// A whole frame: its body and payload (undefined tensor when there was none). The payload's
  /// buffer holds one of the link's `link_buffers` slots until its last copy is freed. A
  /// failure closes the link.
  virtual status deliver(const std::string& peer, std::vector<uint8_t> body,
                         messages::tensor_msg payload) = 0;
  /// A frame `admit` or `check` refused or whose payload could not be decoded (its bytes are read
  /// and dropped, nothing is delivered). True keeps the link (e.g. after telling the sender);
  /// false, the default, closes it.
  virtual bool refused(const std::string& peer, const uint8_t* body, size_t size,
                       const std::string& why);
  /// A link to `peer` can carry frames (either side opened it).
  virtual void link_up(const std::string& peer);
  /// A link to `peer` was lost (not called when the transport stops); frames queued on it are
  /// dropped.
  virtual void link_lost(const std::string& peer, const std::string& why);
};

/// What the links to one peer wrote: payload bytes and the seconds spent in those writes. Not
/// the links' throughput: a write returns once the socket's buffer (or a ring) took the bytes,
/// so on 200 Mbit/s links bytes / seconds read 3.7-18 GB/s (the averager's `codec: auto`
/// measures its rounds instead).
struct link_stats {
  uint64_t bytes = 0;
  double seconds = 0;
};

/// A transport with its listener and links. Thread-safe.
class transport {
public:
  /// Opens a transport (listening on `opts.host` unless it is empty); fails on a host that is not
  /// an IPv4 literal or a port that cannot be bound.
  static result<std::shared_ptr<transport>> open(transport_options opts);

  virtual ~transport() = default;

  /// What peers key their links to this transport by: `host:port` when listening, a random
  /// `client-<hex>` in client mode.
  virtual const std::string& id() const = 0;
  /// The address and port it listens on (port 0 in client mode).
  virtual const std::string& host() const = 0;
  virtual uint16_t port() const = 0;
  /// A one-time token (32 hex digits): the link that presents it is a link to `peer`.
  virtual std::string issue(const std::string& peer) = 0;
  /// Accepts `token` (chosen by the peer, e.g. a transfer's) once for a link from `peer`.
  virtual status accept(const link_token& token, const std::string& peer) = 0;
  /// Opens a link to `peer` at `host:port` presenting `token`, in the background (frames may be
  /// queued at once). Nothing happens when a link to `peer` is open or opening. Fails on a
  /// malformed token or host, port 0, or after `stop`.
  virtual status connect(const std::string& peer, const std::string& host, uint16_t port,
                         const std::string& token) = 0;
  /// True while a link to `peer` (opened by either side) is open or opening.
  virtual bool linked(const std::string& peer) const = 0;
  /// True while an open link to `peer` goes over the same-host Unix socket (`local_links`).
  virtual bool local_link(const std::string& peer) const = 0;
  /// Queues `f` on a link to `peer`; false when there is none.
  virtual bool send(const std::string& peer, std::shared_ptr<outgoing_frame> f) = 0;
  /// Registers `h` under a new channel (>= first_dynamic_channel) and returns it.
  virtual uint32_t add_channel(std::shared_ptr<channel_handler> h) = 0;
  /// Registers `h` under the fixed channel `id` (transfer_channel, ...), replacing another.
  virtual void set_channel(uint32_t id, std::shared_ptr<channel_handler> h) = 0;
  /// Frames for a removed channel are read and dropped.
  virtual void remove_channel(uint32_t id) = 0;
  /// Payload bytes written to `peer` and the seconds spent writing them, over all links to it
  /// so far (links that ended included).
  virtual link_stats written(const std::string& peer) const = 0;
  /// Frames delivered to handlers; frames, links or connections refused or failed; the last
  /// failure (until one, why the congestion control asked for is not used, if it is not);
  /// connections (TCP or same-host) this side opened (a pool's reuse shows here).
  virtual uint64_t delivered() const = 0;
  virtual uint64_t failed() const = 0;
  virtual std::string last_error() const = 0;
  virtual uint64_t connections_opened() const = 0;
  /// Of `connections_opened`, those over the same-host Unix socket (`local_links`).
  virtual uint64_t local_links_opened() const = 0;
  /// Links refused or closed for the sealed channel's reasons, by reason: `plaintext` (an
  /// unsealed link offered to a closed run), `handshake` (a malformed or cut handshake),
  /// `signature` (a forged handshake or the wrong key), `not_admitted` (a proven key the gate
  /// does not admit), `record` (a malformed record header), `tampered` (a record that failed
  /// authentication: tampered, replayed, reordered or dropped); on same-host links, `ring` (a
  /// peer's ring that is not a sealed memory file of a valid size, a ring position other than
  /// where the payload must lie, or a ring frame on a link without a ring).
  virtual std::map<std::string, uint64_t> refusals() const = 0;
  /// The TCP congestion control its TCP links use: the option's, or empty for the system's
  /// (asked for none, or the kernel refused the one asked for).
  virtual std::string congestion_control() const = 0;
  /// True when links are sealed (`transport_options::security` set).
  virtual bool sealed() const = 0;
  /// Closes every link and the listener and joins the threads; queued frames are dropped.
  /// Idempotent; the owner calls it before its actor system shuts down.
  virtual void stop() = 0;
};

} // namespace starling::actors::transfer
