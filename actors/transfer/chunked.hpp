// Chunked tensor transfer between nodes: a sender actor encodes a tensor once, splits the bytes
// into bounded chunks and keeps at most `window` of them unacknowledged; a receiver actor acks
// each chunk, reassembles the payload, decodes it and hands the tensor to a local sink.
//
// Why: one big actor message is copied several times, faults in fresh pages and blocks the
// connection (CAF-NOTES, pitfall 7); bounded chunks with a credit window keep the pipeline full
// with little memory and let other messages interleave.
#pragma once

#include <cstdint>

#include <caf/fwd.hpp>

namespace starling::actors::transfer {

/// Settings of a chunk sender.
struct chunked_options {
  /// Bytes per chunk (≥ 1); 4 MiB measured best over loopback (CAF-NOTES).
  uint64_t chunk_bytes = uint64_t{4} << 20;
  /// Chunks in flight before the sender waits for an ack (≥ 1).
  uint32_t window = 4;
};

/// Settings of a chunk receiver.
struct receiver_options {
  /// Largest payload accepted from a sender; larger announced transfers are refused before any
  /// memory is reserved.
  uint64_t max_bytes = uint64_t{16} << 30;
};

/// Spawns a sender. It answers `(transfer_atom, messages::tensor_msg, caf::actor receiver)`
/// with the payload size in bytes (`uint64_t`) once the receiver decoded the tensor, or with
/// an error (encoding failed, the receiver refused or could not decode, the receiver died).
/// Several transfers may run at once, each with its own window.
caf::actor spawn_chunk_sender(caf::actor_system& sys, chunked_options opts = {});

/// Spawns a receiver that sends every reassembled `messages::tensor_msg` to `sink` (on the
/// receiver's node, so the tensor moves by reference). Publish it for remote senders.
caf::actor spawn_chunk_receiver(caf::actor_system& sys, caf::actor sink,
                                receiver_options opts = {});

/// The behaviour of a chunk receiver, for actors that take chunks beside other messages (the
/// direct receiver of data_channel.hpp falls back to it).
caf::behavior chunk_receiver_behavior(caf::event_based_actor* self, caf::actor sink,
                                      receiver_options opts);

} // namespace starling::actors::transfer
