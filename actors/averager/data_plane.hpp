// The averager's data plane: persistent TCP links between averagers for the chunks of butterfly
// rounds, beside BASP.
//
// Why: over BASP a chunk is encoded into a Cap'n Proto buffer, copied by CAF's serializer
// (~340 MB/s for byte vectors here, CAF-NOTES), copied into the multiplexer's write buffer, read
// into CAF's buffer, deserialized into a vector and decoded: a 16M-float round with 4 peers
// moved at 12.6x Gloo's time on loopback. On the plane the sender's socket thread writes the
// tensor's bytes straight from its storage (fp32 `none` is referenced, not copied; a compressed
// chunk is encoded once on that thread, in parallel with the actor, and shared by every peer it
// goes to), and the receiver's thread reads into a pooled buffer that becomes the tensor. Links
// stay open across rounds, so a round pays no handshakes once the peers have met.
//
// Control stays in actors: a sender asks the receiving averager over BASP for a one-time token
// (`avg_plane_atom`, see messages/averager.hpp); the link presenting that token delivers its
// chunks as that sender (the averager still checks that each chunk's member index is that
// address). Everything read from a link is validated (plane_frame.hpp, the hardened tensor
// decoder, size limits); a bad frame closes the link and delivers nothing more from it.
// A link that breaks is reported to the averager, which treats its chunks as lost (the round's
// deadline and exclusion rules cover them) and opens a new link in the next round.
//
// Threads: one acceptor, one reader per incoming link, one writer per outgoing link. They never
// touch actor state; they `anon_send` to the sink:
//   `(avg_plane_atom, uint64_t tag, std::string peer, messages::avg_chunk)`  a delivered chunk,
//   `(avg_plane_atom, uint64_t tag, std::string peer, std::string error)`    a lost outgoing link.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/actor.hpp>

#include "actors/averager/plane_frame.hpp"
#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"

namespace starling::messages {
class chunk_source;
}

namespace starling::actors::averager {

/// Settings of a data plane.
struct data_plane_options {
  /// IPv4 literal to listen on (the node's address; "localhost" = 127.0.0.1).
  std::string host = "127.0.0.1";
  /// Port; 0 lets the OS choose.
  uint16_t port = 0;
  /// Longest wait for progress inside a frame, a preamble or a connect.
  std::chrono::milliseconds io_timeout{10000};
  /// How long an issued token waits for its link.
  std::chrono::milliseconds token_ttl{60000};
  /// Incoming links at once; more are closed at once.
  uint32_t max_links = 64;
  /// Largest payload a frame may carry.
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  /// Receive buffers kept for reuse.
  uint32_t pool_buffers = 16;
  /// Delivered chunks of one incoming link the sink may hold at once; the link reads no further
  /// (TCP then slows its sender) until the sink drops one. At least 1.
  uint32_t link_buffers = 2;
};

/// One chunk to send: its meta and values (a 1-D float tensor; empty for an error result),
/// encoded on first use by whichever link sends it first and shared by all of them.
class plane_chunk {
public:
  plane_chunk(plane_meta meta, at::Tensor values, kernels::codec_id codec,
              kernels::codec_params params);
  ~plane_chunk();

  /// Encodes once (thread-safe). A codec that cannot encode the values (e.g. fp16 out of range)
  /// falls back to `none`, as the BASP path does.
  const status& encode();
  const std::vector<uint8_t>& meta_bytes() const { return meta_bytes_; }
  /// The payload (null when there are no values); valid after a successful `encode`.
  const std::shared_ptr<const messages::chunk_source>& payload() const { return payload_; }

private:
  plane_meta meta_;
  at::Tensor values_;
  kernels::codec_id codec_;
  kernels::codec_params params_;
  std::once_flag once_;
  status status_;
  std::vector<uint8_t> meta_bytes_;
  std::shared_ptr<const messages::chunk_source> payload_;
};

/// A listening data plane with its links. Thread-safe.
class data_plane {
public:
  /// Opens the plane; delivered chunks and lost links go to `sink` (see messages/averager.hpp).
  static result<std::shared_ptr<data_plane>> open(caf::actor sink, data_plane_options opts);

  virtual ~data_plane() = default;

  virtual const std::string& host() const = 0;
  virtual uint16_t port() const = 0;
  /// A random number every message to the sink carries: the sink accepts plane messages only with
  /// it (a remote node could otherwise send the same message over BASP).
  virtual uint64_t tag() const = 0;
  /// A one-time token (32 hex digits): the link that presents it delivers as `peer`.
  virtual std::string issue(const std::string& peer) = 0;
  /// Opens a link to `peer` at `host:port` presenting `token` (in the background: chunks may be
  /// queued at once), replacing a dead link to it. Fails on a malformed token or after `stop`.
  virtual status connect(const std::string& peer, const std::string& host, uint16_t port,
                         const std::string& token) = 0;
  /// True while a link to `peer` is open or opening.
  virtual bool linked(const std::string& peer) const = 0;
  /// Queues `c` on the link to `peer`; false when there is no live link.
  virtual bool send(const std::string& peer, std::shared_ptr<plane_chunk> c) = 0;
  /// Chunks delivered to the sink, frames or links refused, and the last failure.
  virtual uint64_t delivered() const = 0;
  virtual uint64_t failed() const = 0;
  virtual std::string last_error() const = 0;
  /// Closes every link and the listening socket and joins the threads; queued chunks are dropped.
  /// Idempotent.
  virtual void stop() = 0;
};

} // namespace starling::actors::averager
