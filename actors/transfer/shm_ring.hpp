// Shared-memory rings of same-host links (transport.hpp, `transport_options::local_links`).
//
// Each side of a same-host link writes its large payloads into a ring it created (a memfd sealed
// against shrinking, passed to the peer once over the link's Unix socket) and sends on the socket
// only the frame's header, meta and the payload's position; the peer's handler reads the payload
// in place. One copy per payload instead of the two of a socket and no TCP stack: on 2 cores
// the kernel's copies and stack were two thirds of an all-reduce's CPU.
//
// A ring is a control page (the reader's release position and a futex word) and `capacity` data
// bytes. Positions are byte counters that only grow; a payload sits at `ring_place(...)`
// (contiguous, aligned, starting over at the ring's beginning when it would not fit before the
// end), so the reader computes where the next payload must be and refuses any other claim.
// Regions are released in any order and the release position advances over the released
// prefix. Without room the writer waits (futex, bounded, no spinning) for releases; when the
// reader has read every payload and still releases nothing for a grace period, its handlers
// hold the ring, and payloads go on the socket until the release position moves (a payload
// held for long costs a TCP link nothing more than its buffer either).
//
// The peer can write its ring at any time: the reader copies what it parses out first
// (socket_io.hpp's `decode_ring`), and everything read from the control page is checked.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "kernels/result.hpp"

namespace starling::actors::transfer {

/// Bytes of a ring's control page, before its data.
inline constexpr uint64_t ring_control_bytes = 4096;
/// Data bytes of the ring each side of a same-host link writes into: room for two payloads of
/// 1 MiB (the averager's chunks) with their headers, what a link's handlers hold at once by
/// default (`link_buffers`). Every page of it ends up resident in both processes (8 processes
/// map 14 rings each), so it is no larger.
inline constexpr uint64_t ring_default_bytes = (uint64_t{2} << 20) + (uint64_t{64} << 10);
/// Data sizes a peer's ring may have.
inline constexpr uint64_t ring_min_bytes = uint64_t{64} << 10;
inline constexpr uint64_t ring_max_bytes = uint64_t{256} << 20;
/// Alignment of every payload's position (8 at least: Cap'n Proto words).
inline constexpr uint64_t ring_align = 64;

/// Where a payload of `size` bytes (1 .. capacity) goes in a ring of `capacity` data bytes when
/// the previous one ended at `next`: `next` rounded up to `ring_align`, or the start of the next
/// lap when it would not fit before the ring's end.
uint64_t ring_place(uint64_t next, uint64_t size, uint64_t capacity);

/// A mapped ring. Thread-safe to read; the control words are atomics.
class ring_map {
public:
  /// Creates a ring of `capacity` data bytes (a page multiple in [ring_min_bytes,
  /// ring_max_bytes]), sealed against shrinking and growing.
  static result<std::shared_ptr<ring_map>> create(uint64_t capacity);
  /// Maps a ring received from a peer (takes `fd`): fails unless it is a memfd sealed against
  /// shrinking (so no access can fault) whose size is a control page and a valid capacity.
  static result<std::shared_ptr<ring_map>> adopt(int fd);
  ~ring_map();
  ring_map(const ring_map&) = delete;
  ring_map& operator=(const ring_map&) = delete;

  /// The memfd (owned), to pass to the peer.
  int fd() const { return fd_; }
  /// Data bytes.
  uint64_t capacity() const { return capacity_; }
  /// The data byte at position `pos` (taken modulo the capacity).
  uint8_t* at(uint64_t pos) const { return data_ + pos % capacity_; }
  /// The reader's release position (written by the reader, checked by the writer).
  std::atomic<uint64_t>& tail() const;
  /// The end of the last payload the reader claimed (written by the reader, checked).
  std::atomic<uint64_t>& claimed() const;
  /// Bumped by the reader after each claim and release; the writer waits on it.
  std::atomic<uint32_t>& seq() const;

private:
  ring_map(int fd, uint8_t* base, uint64_t capacity);
  int fd_;
  uint8_t* base_;
  uint8_t* data_;
  uint64_t capacity_;
};

/// The writing side of a ring (the link's writer thread; `abort` from any thread).
class ring_writer {
public:
  explicit ring_writer(std::shared_ptr<ring_map> ring) : ring_(std::move(ring)) {}

  const ring_map& ring() const { return *ring_; }
  /// Room for `size` bytes (1 .. capacity): its position, after waiting for the reader to
  /// release enough; none when the reader has read every payload and released nothing for
  /// `grace` (at once while the release position has not moved since): send this one on the
  /// socket. Fails after `timeout` without room, after `abort`, or when the reader's positions
  /// are impossible (a hostile or broken peer).
  result<std::optional<uint64_t>> reserve(uint64_t size, std::chrono::milliseconds timeout,
                                          std::chrono::milliseconds grace);
  /// Wakes a waiting `reserve` and fails every later one.
  void abort();

private:
  std::shared_ptr<ring_map> ring_;
  uint64_t next_ = 0;
  /// The release position at which the handlers were last found holding the ring.
  std::optional<uint64_t> held_at_;
  std::atomic<bool> aborted_{false};
};

/// The reading side of a ring: checks each claimed position and releases regions in any order
/// (handlers free payloads on any thread). Thread-safe.
class ring_reader {
public:
  explicit ring_reader(std::shared_ptr<ring_map> ring);
  ~ring_reader();
  ring_reader(const ring_reader&) = delete;
  ring_reader& operator=(const ring_reader&) = delete;

  const ring_map& ring() const { return *ring_; }
  /// Accepts a payload of `size` bytes claimed at `pos` when it is exactly where the writer
  /// must have placed it; it then holds its region until `release(pos)`.
  status claim(uint64_t pos, uint64_t size);
  /// Gives a claimed region back (the writer may overwrite it).
  void release(uint64_t pos);
  /// Read-only zero pages of the ring's capacity, never written (a stand-in for a payload's
  /// bulk while its structure is parsed: see `decode_ring`).
  const uint8_t* zeros() const { return zeros_; }

private:
  struct region {
    uint64_t start;
    uint64_t end;
    bool released;
  };
  std::shared_ptr<ring_map> ring_;
  uint8_t* zeros_ = nullptr;
  std::mutex mu_;
  std::deque<region> held_;
  uint64_t next_ = 0;
};

} // namespace starling::actors::transfer
