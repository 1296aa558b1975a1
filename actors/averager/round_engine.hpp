// The protocol core of one butterfly round (no CAF, no sockets): which chunks go where and when,
// credit windows, duplicates, senders cut mid-way, the reduction and the resolution of every part.
//
// The engine is driven by its shell (the averager actor, or a test network): the shell tells it
// that a link to a member is open (with the credit window that link needs), hands it every chunk
// and acknowledgement that arrives, says when a member is gone and when the deadlines pass. The
// engine hands chunks to a `round_sink`; faults are injected by decorating that sink (a sink
// that drops everything after some sends is a peer that crashed mid-way), never by flags here.
//
// Rules (the same as averager.hpp describes for the whole round):
// - Every non-auxiliary member sends part j of its vector to member j in chunks of at most
//   `chunk_elems` elements, at most `window` unacknowledged per destination on links that need
//   credits (window 0: the link paces itself, e.g. TCP).
// - Member j reduces once every sender completed or was excluded, or at the reduce deadline
//   (senders still incomplete are cut there: the streamed weighted mean counts what they
//   delivered, a kept-chunks reducer drops them), then sends the result to every non-auxiliary
//   member, cut where the contributors change. An error result says why it could not reduce.
// - With the streamed weighted mean, member j does not wait for that: each chunk-sized range of
//   its part (from its start, in order) goes out as a result chunk as soon as every sender
//   delivered it (`part_reducer::finish_early`), so results flow while contributions still
//   arrive and no link idles between the two phases (measured on 200 Mbit/s links: the phases'
//   barrier cost 10-15% of a round against a ring). The rest goes out at the reduction.
// - A chunk already delivered is ignored; a malformed contribution excludes its sender; a
//   malformed result keeps the member's own values for that part.
// - A part whose reducer is gone, failed or missed the round deadline keeps the member's own
//   values. The result is ready once every part is resolved (an auxiliary member also waits for
//   its own reduction); the round is finished once, in addition, the engine's own part went out.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "actors/averager/butterfly.hpp"
#include "actors/averager/chunk.hpp"

namespace starling::actors::averager {

/// A chunk leaving the engine: its meta and values (a 1-D fp32 view of the sender's vector or of
/// the reduced part; undefined for an error result). One result chunk is shared by all its
/// destinations (a transport encodes it once); nothing modifies it once handed out.
struct out_chunk {
  chunk_meta meta;
  at::Tensor values;
};

using out_chunk_ptr = std::shared_ptr<const out_chunk>;

/// Where an engine's chunks go: the averager's links, or a test network.
class round_sink {
public:
  virtual ~round_sink() = default;
  /// Hands `c` to member `to`. Chunks of one kind to one member arrive in order, or not at all.
  virtual void send(uint32_t to, const out_chunk_ptr& c) = 0;
};

/// A BLAKE2b-256 digest.
using digest = std::array<uint8_t, 32>;

/// BTARD hook: digests of every part as this member sent and received it. Each digest covers a
/// stream of chunks: BLAKE2b over (offset, size, BLAKE2b(values as fp32 bytes)) of each chunk in
/// offset order, so a sender and its receiver compute the same digest over the same chunks (for
/// a lossless codec; with a lossy one, hash the decoded values on both sides). All zero where no
/// chunk went or came.
struct part_digests {
  /// Per part j: this member's contribution as sent to reducer j (its own part: as added).
  std::vector<digest> sent;
  /// Per member i: i's contribution to this member's part as received.
  std::vector<digest> received;
  /// This member's reduced part as sent to every member.
  digest result_sent{};
  /// Per part j: the result as received from reducer j.
  std::vector<digest> result_received;
};

/// Settings of a round engine.
struct round_engine_options {
  /// Largest chunk in elements (>= 1).
  int64_t chunk_elems = int64_t{1} << 18;
  /// The reduction: empty = the weighted mean, streamed chunk by chunk; another function (e.g.
  /// CenteredClip for BTARD) sees whole contributions (see part_reducer).
  reduce_fn reducer;
  /// Compute `part_digests` (BLAKE2b over every chunk: costs about one pass over the data).
  bool hash_parts = false;
  /// The member's own vector is known to be finite (its shell checked it): its own part is not
  /// read once more for that.
  bool input_finite = false;
  /// Applied to the own part's reduced values (1-D fp32, changed in place; the argument before
  /// them is the part's offset in the vector) before they go out, e.g. Top-k with the reducer's
  /// error feedback (sparse_parts.hpp); a failure fails the part's reduction. Set, the results
  /// go out only after the reduction (no streaming of finished ranges before it).
  std::function<status(int64_t offset, at::Tensor& values)> finish_part;
};

/// What a round produced for its member.
struct round_result {
  /// The whole flat vector: averaged parts and own values where a part was not averaged.
  at::Tensor values;
  /// One report per part, in member order.
  std::vector<part_report> parts;
  /// Per member: the weight its contribution brought to every element of this member's part
  /// (-1 where it reached not all of it, or this member reduced nothing).
  std::vector<double> received;
};

/// One member's side of one butterfly round.
class round_engine {
public:
  /// A round `id` of `plan` as member `self` with its flat fp32 vector `flat` (contiguous; must
  /// stay unchanged until the round is finished) and `weight`, sending through `sink` (which
  /// must outlive the engine). `out_buffer` and `reduce_buffer` (fp32, the vector's and this
  /// member's part's size; e.g. from an earlier round) receive the result and the reduction;
  /// others are allocated when they do not fit. `out_buffer` may be `flat` itself (in place: no
  /// second vector; result chunks overwrite the own values as they arrive, so a part that ends
  /// unaveraged after some of its result arrived keeps those averaged elements, and its report
  /// says how many). Nothing is sent before `open`.
  round_engine(uint64_t id, round_plan plan, uint32_t self, at::Tensor flat, double weight,
               round_engine_options opts, round_sink& sink, at::Tensor out_buffer = {},
               at::Tensor reduce_buffer = {});

  round_engine(const round_engine&) = delete;
  round_engine& operator=(const round_engine&) = delete;

  /// The link to `member` can carry chunks: at most `window` unacknowledged ones per kind, or any
  /// number with window 0. May be called again (a link replaced by another one); chunks handed
  /// out before stay counted until acknowledged.
  void open(uint32_t member, uint32_t window);
  /// A chunk that arrived (`values` 1-D float, undefined when it had none or could not be
  /// decoded). The engine reads `values` before returning unless a kept-chunks reducer needs it
  /// (it copies then), so a transport may reuse the buffer at once.
  void on_chunk(const chunk_meta& meta, const at::Tensor& values);
  /// `member` acknowledged one chunk of `kind` (one credit back).
  void on_ack(uint32_t member, uint8_t kind);
  /// `member` left, went down or cannot be reached: nothing more goes to or comes from it.
  void member_gone(uint32_t member, const std::string& why);
  /// The reduce deadline passed: reduce with what arrived.
  void reduce_deadline();
  /// The round deadline passed: unresolved parts keep own values; the round is finished.
  void round_deadline();

  /// True once every part is resolved: `result()` is final.
  bool ready() const { return ready_; }
  /// True once the result is ready and nothing is left to send (or the round deadline passed).
  bool finished() const { return finished_; }
  /// The result so far (final once `ready`).
  round_result result() const;

  uint64_t id() const { return id_; }
  const round_plan& plan() const { return plan_; }
  uint32_t self() const { return self_; }
  bool auxiliary() const { return aux_; }
  /// True for a member reported gone.
  bool gone(uint32_t member) const { return gone_.at(member); }
  /// Contribution chunks this member sends in all (for tests and fault decorators).
  uint64_t contribution_chunks() const { return contribution_chunks_; }
  /// Digests (all zero unless `hash_parts`); complete once `finished`.
  part_digests digests() const;
  /// The result and reduction buffers, for reuse in a later round once the result is dropped.
  std::pair<at::Tensor, at::Tensor> buffers() const { return {out_, reduced_part_}; }

private:
  struct pending_chunk {
    int64_t offset = 0;
    int64_t len = 0;
  };
  struct stream {
    std::vector<pending_chunk> queue; // sent from `next`
    size_t next = 0;
    uint32_t inflight = 0;
    bool empty() const { return next >= queue.size(); }
  };
  struct link {
    bool open = false;
    uint32_t window = 0;
  };
  /// (offset, size, digest of the values) of each chunk of one stream.
  using chunk_log = std::vector<std::tuple<int64_t, int64_t, digest>>;

  void pump(uint32_t member, uint8_t kind);
  out_chunk_ptr make_chunk(uint32_t member, uint8_t kind, const pending_chunk& pc);
  /// A chunk of `kind` from this member for `part` at `offset`, without values yet.
  std::shared_ptr<out_chunk> new_chunk(uint8_t kind, uint32_t part, int64_t offset) const;
  /// A result chunk of the own part at `offset` (an error one, without values, once the
  /// reduction failed).
  out_chunk_ptr result_chunk_of(int64_t offset, std::vector<uint32_t> contributors,
                                at::Tensor values) const;
  void maybe_reduce(bool deadline);
  /// Sends the result chunks of the own part that can go out before the reduction.
  void stream_results();
  /// How the own part's result is cut into chunks, from `from` on: chunk-sized ranges up to
  /// `streamed_end_` (sent before the reduction), then each segment in chunks.
  std::vector<pending_chunk> result_cuts(int64_t from) const;
  std::vector<uint32_t> contributors_at(int64_t offset) const;
  void resolve_part(uint32_t part, part_status st, std::string reason,
                    std::vector<uint32_t> contributors = {});
  void check_done();
  static void log_chunk(chunk_log& log, int64_t offset, const at::Tensor& values);
  static digest finish_log(chunk_log log);

  uint64_t id_;
  round_plan plan_;
  uint32_t self_;
  at::Tensor flat_;
  double weight_;
  round_engine_options opts_;
  round_sink& sink_;
  bool aux_ = false;
  at::Tensor out_;
  /// `out_` is `flat_` (see the constructor).
  bool in_place_ = false;
  std::vector<link> links_;
  std::vector<bool> gone_;
  std::map<std::pair<uint32_t, uint8_t>, stream> streams_;
  std::unique_ptr<part_reducer> reducer_;
  bool reduced_ = false;
  at::Tensor reduced_part_;
  std::vector<part_segment> reduced_segments_;
  std::string reduce_error_;
  /// The own part's result [0, streamed_end_) went out before the reduction.
  int64_t streamed_end_ = 0;
  /// Result chunks of our part by offset, built once and shared by every destination.
  std::map<int64_t, out_chunk_ptr> result_chunks_;
  std::vector<part_report> parts_;
  /// See `round_result::received`.
  std::vector<double> received_;
  std::vector<bool> resolved_;
  std::vector<range_set> result_ranges_;
  std::vector<std::vector<part_segment>> result_pieces_;
  uint64_t contribution_chunks_ = 0;
  bool ready_ = false;
  bool finished_ = false;
  // BTARD hooks (hash_parts only).
  std::vector<chunk_log> sent_logs_;
  std::vector<chunk_log> received_logs_;
  std::vector<chunk_log> result_received_logs_;
};

} // namespace starling::actors::averager
