// The decision core of the collaborative optimizer (DeDLOC) as a state machine: the owning actor
// (a data-parallel peer or a SWARM stage peer) feeds it events — samples processed, progress
// read from the DHT, an averaging round's outcome, a state download's outcome, a timer — and
// carries out the effects it returns: publish or withdraw the progress record, read the
// collaboration's progress, take the step's gradient out and average it (weight = samples), apply
// the averaged gradient or step on its own, pause computing, average parameters and optimizer
// statistics, download the state from donors. No CAF, no torch, no clock: `now` comes with every
// event, and every deadline the core keeps comes back as a `wake_at` effect.
//
// Phases:
//
//     accumulating ──target reached──▶ averaging ──done/failed/deadline──▶ accumulating
//          │  ▲                                         │ every K steps, or the first update
//          │  │                                         │ after a lone step (resync)
//          │  └──────────done/failed/deadline──── state_averaging ◀┘
//          │  ▲
//          └──peers at a later step──▶ downloading ──done/failed/deadline──┘
//     any ──leave──▶ left
//
// Sample accounting: every sample reported goes exactly once into one of: a round whose average
// was applied, a step on the peer's own gradient, dropped (a skipped step, a discarded gradient
// after a download, or reported after leaving), still pending, or the round in flight
// (`coordinator_stats`). A round's samples are taken out when it starts; samples processed
// while it runs count towards the next step.
//
// Resync after a lone step (`resync_after_lone_step`): a peer that stepped on its own gradient
// (its round failed, found no partner or hit the deadline) holds parameters that differ from its
// peers' for good. It flags its progress record and, after its next update, averages parameters
// and optimizer statistics with the peers at the new step, as `average_state_every` does; a peer
// that finishes the same step and saw the flag in its last read joins that state round. A failed
// resync is tried once more after the following update, then given up (never a loop: a state
// round only ever starts after an update).
// While the resync is due, a read that shows full-mode peers at the peer's own step whose records
// ask for none (they took that step's averaged update without it: a newcomer whose first round
// missed the group, a peer whose round alone failed) sends it downloading their state instead,
// when they outnumber the peers at that step that ask for a resync (this one included): the
// collaboration's state replaces its own, and no one has to join anything. Where many stepped
// alone (rounds failing all over), the state round brings them back together instead: downloads
// would pause peer after peer while the others wait for them in the next rounds (64 peers with
// delayed updates: half the throughput).
//
// Delayed parameter updates (`delay_updates`): the peer keeps computing while step t's gradient
// is averaged, so step t + 1's first gradients are computed on parameters one step old; the
// averaged update is applied when it arrives. Without it the core pauses computing for the round.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "actors/collab/progress.hpp"
#include "kernels/result.hpp"

namespace starling::actors::collab {

/// How a peer takes part.
enum class peer_mode : uint8_t {
  /// Computes gradients, reduces parts, serves its state.
  full,
  /// Computes gradients, sends and receives over links it opened; never reduces, never a donor.
  client,
  /// Reduces parts with weight 0 and computes nothing (it holds no model state).
  auxiliary,
};

/// Tunables of the collaborative optimizer's decisions.
struct coordinator_options {
  /// The estimate and refresh period (target batch, refresh bounds, record lifetime).
  progress_options progress;
  /// How this peer takes part.
  peer_mode mode = peer_mode::full;
  /// Weight of a new measurement in the local samples-per-second EMA.
  double rate_alpha = 0.1;
  /// After new samples, publish the record again at most this often (as DeDLOC does after
  /// every local step, rate-limited): others' estimates extrapolate from fresh records.
  seconds publish_interval = 1;
  /// Delayed parameter updates: keep computing while a round runs (see the file comment).
  bool delay_updates = false;
  /// A peer that reported no samples for this long counts its own rate as 0 in its record and
  /// its estimate: a server whose work comes from others (a SWARM stage whose trainers stopped)
  /// must not let the collaboration extrapolate samples that never come and step on nothing.
  /// 0 = never (a peer that computes by itself; pauses are not idleness).
  seconds idle_after = 0;
  /// After a failed round, step on the peer's own gradient (true) or drop it (false).
  bool step_on_failure = true;
  /// Average parameters and optimizer statistics after every K-th step; 0 = never.
  uint64_t average_state_every = 0;
  /// After a lone step (`step_own`), average parameters and optimizer statistics after the next
  /// update, and join such a resync when a peer at the same step asks for it in its record.
  bool resync_after_lone_step = true;
  /// After a round that found nobody while the last read showed nobody else, step alone without
  /// rounds until a read shows another peer (`deserted_`). The SWARM stage peer turns it on: its
  /// partners die with their nodes and come back through a state download. The data-parallel
  /// peer keeps trying rounds (its partitioned peers come back through a state round).
  bool lone_steps_when_deserted = false;
  /// With it: a resync is a download from the peers at the step that took the averaged update,
  /// when they are the most (see the file comment); else always a state round.
  bool resync_by_download = true;
  /// A gradient round not finished this long after it started is abandoned (a peer that left
  /// mid-round does not make the others wait longer).
  seconds round_timeout = 30;
  /// Same for a state-averaging round.
  seconds state_round_timeout = 60;
  /// A progress read not answered this long after it was asked is given up.
  seconds read_timeout = 5;
  /// A state download not finished this long after it started is abandoned.
  seconds download_timeout = 60;
  /// After a failed download, wait this long before reading again (and maybe downloading).
  seconds download_retry = 5;
  /// At most this many donors to download parts of the state from.
  size_t max_donors = 4;
  /// Keep the gradient accumulated before a download for the next step (it was computed on the
  /// old parameters); the default drops it, as hivemind does.
  bool keep_gradients_on_download = false;
};

/// Checks `o`: valid progress options, rate_alpha in (0, 1], positive intervals and timeouts,
/// max_donors >= 1.
status validate(const coordinator_options& o);

/// Publish the peer's progress record under its own sub-key (the peer id), expiring at
/// `expires_at`.
struct publish_progress {
  /// Encoded record (`encode_progress`).
  std::vector<char> value;
  /// Expiry on the collaboration's clock.
  seconds expires_at = 0;
};

/// Publish a tombstone over the peer's record: it leaves on purpose and stops counting at once.
struct withdraw_progress {
  /// Encoded tombstone record.
  std::vector<char> value;
  /// Expiry (later than any record the peer published, so that the DHT keeps the tombstone).
  seconds expires_at = 0;
};

/// Read every peer's record of the progress key; answer with `progress_read` or
/// `progress_read_failed`.
struct read_progress {};

/// Deliver `timer(now)` at `at` (a new wake-up replaces the previous one; extra timers are
/// harmless).
struct wake_at {
  /// When.
  seconds at = 0;
};

/// Take the step's accumulated mean gradient out (later samples accumulate into the next step)
/// and average it for `step` with weight `samples`; answer with `round_done(id)` or
/// `round_failed(id)`.
struct start_round {
  /// Round id, echoed by the answer.
  uint64_t id = 0;
  /// The global step being averaged.
  uint64_t step = 0;
  /// The weight: samples in the gradient (0 for an auxiliary peer or an empty step).
  uint64_t samples = 0;
  /// The core stops waiting at this time.
  seconds deadline = 0;
};

/// Stop waiting for round `id`: its answer, if any comes, is ignored.
struct abandon_round {
  /// Round id.
  uint64_t id = 0;
};

/// Step the optimizer on round `id`'s averaged gradient (clipped).
struct apply_averaged {
  /// Round id.
  uint64_t id = 0;
  /// The step it completes.
  uint64_t step = 0;
};

/// Step the optimizer on the peer's own gradient taken out for round `id` (the round failed).
struct step_own {
  /// Round id.
  uint64_t id = 0;
  /// The step it completes.
  uint64_t step = 0;
  /// Samples in that gradient.
  uint64_t samples = 0;
};

/// Take the step's accumulated mean gradient out and step the optimizer on it at once, without
/// averaging: the peer has seen no other peer since it started (a collaboration of one), so an
/// averaging round would only wait out its matchmaking window for nobody.
struct step_alone {
  /// Id of the step (from the same sequence as rounds).
  uint64_t id = 0;
  /// The step it completes.
  uint64_t step = 0;
  /// Samples in the gradient.
  uint64_t samples = 0;
};

/// Drop the gradient taken out for round `id` without stepping.
struct skip_step {
  /// Round id.
  uint64_t id = 0;
  /// The step not taken.
  uint64_t step = 0;
};

/// Stop starting new microbatches until `resume_compute` (ones in flight may still finish).
struct pause_compute {};

/// Start microbatches again.
struct resume_compute {};

/// Average parameters and optimizer statistics with the peers at `step`; answer with
/// `state_round_done(id)` or `state_round_failed(id)`.
struct start_state_round {
  /// Round id.
  uint64_t id = 0;
  /// The step every participant stands at.
  uint64_t step = 0;
  /// The core stops waiting at this time.
  seconds deadline = 0;
  /// Started to bring the peers together again after a lone step (not the periodic round).
  bool resync = false;
};

/// Load the averaged parameters and optimizer statistics of state round `id`.
struct load_averaged_state {
  /// Round id.
  uint64_t id = 0;
};

/// Stop waiting for state round `id`; keep the own state.
struct abandon_state_round {
  /// Round id.
  uint64_t id = 0;
};

/// Download parameters and optimizer state at step `step` or later, in parts from the `donors`;
/// load it all or nothing, then answer `download_done(id, loaded step)` or `download_failed(id)`.
struct download_state {
  /// Download id.
  uint64_t id = 0;
  /// The lowest acceptable step.
  uint64_t step = 0;
  /// Peer ids of donors (full-mode peers at `step`), in order of preference.
  std::vector<std::string> donors;
  /// The core stops waiting at this time.
  seconds deadline = 0;
  /// The peer stepped alone and takes the state of peers at its own step (`resync_downloads`).
  bool resync = false;
};

/// Stop waiting for download `id`; load nothing that arrives for it.
struct abandon_download {
  /// Download id.
  uint64_t id = 0;
};

/// Zero the accumulated gradient (its samples were dropped).
struct discard_gradients {};

/// Something the owning actor must do.
using effect =
    std::variant<publish_progress, withdraw_progress, read_progress, wake_at, start_round,
                 abandon_round, apply_averaged, step_own, step_alone, skip_step, pause_compute,
                 resume_compute,
                 start_state_round, load_averaged_state, abandon_state_round, download_state,
                 abandon_download, discard_gradients>;

/// Where the core stands.
enum class coordinator_phase : uint8_t {
  /// Not started.
  idle,
  /// Accumulating samples towards the current step.
  accumulating,
  /// A gradient round for the current step runs.
  averaging,
  /// A parameter + optimizer statistics round runs.
  state_averaging,
  /// Downloading the state of peers ahead.
  downloading,
  /// Left the collaboration.
  left,
};

/// What happened so far.
struct coordinator_stats {
  /// Samples reported.
  uint64_t samples_reported = 0;
  /// Samples in rounds whose averaged gradient was applied.
  uint64_t samples_averaged = 0;
  /// Samples in own-gradient steps after failed rounds.
  uint64_t samples_alone = 0;
  /// Samples dropped (skipped steps, discarded gradients, reported by an auxiliary peer or after
  /// leaving).
  uint64_t samples_dropped = 0;
  /// Samples reported while an update was in flight (computed on parameters one step old).
  uint64_t samples_stale = 0;
  /// Gradient rounds started / whose average was applied / failed / abandoned at the deadline.
  uint64_t rounds = 0, rounds_averaged = 0, rounds_failed = 0, rounds_timed_out = 0;
  /// Of `rounds_averaged`, those that were partial averages.
  uint64_t rounds_partial = 0;
  /// Own-gradient steps (after failed rounds, and `step_alone`) and skipped steps.
  uint64_t own_steps = 0, skipped_steps = 0;
  /// Of the own-gradient steps, those taken without a round by a peer that saw nobody else.
  uint64_t solo_steps = 0;
  /// State rounds started / loaded / failed or timed out.
  uint64_t state_rounds = 0, state_rounds_loaded = 0, state_rounds_failed = 0;
  /// Of those, resyncs after a lone step started / failed or timed out (a failed one is tried
  /// once more after the next update).
  uint64_t resyncs = 0, resyncs_failed = 0;
  /// Downloads started / finished / failed or timed out.
  uint64_t downloads = 0, downloads_done = 0, downloads_failed = 0;
  /// Of the downloads started, those of a peer that stepped alone from peers at its own step
  /// that did not (the collaboration's state replaces its own: a resync by download).
  uint64_t resync_downloads = 0;
  /// Progress reads answered / failed or timed out; records refused (malformed or mismatched).
  uint64_t reads = 0, reads_failed = 0, records_rejected = 0;
  /// Answers for rounds or downloads the core had already given up on.
  uint64_t stale_answers = 0;
};

/// The collaborative optimizer's decision core for one peer.
class coordinator {
public:
  /// A core for peer `self` (its id, the sub-key of its records) standing at `step`.
  coordinator(std::string self, coordinator_options opts, uint64_t step = 0);

  /// Joins at `now`: publishes its record and reads the collaboration's.
  std::vector<effect> start(seconds now);

  /// The peer finished `samples` samples whose gradient it accumulated.
  std::vector<effect> samples_done(uint64_t samples, seconds now);

  /// A progress read answered with the records of `entries` (untrusted values).
  std::vector<effect> progress_read(const std::vector<progress_entry>& entries, seconds now);

  /// A progress read failed.
  std::vector<effect> progress_read_failed(seconds now);

  /// Round `id` produced an averaged gradient (complete or partial).
  /// `group`: the round's group size when the owner knows it (0: unknown). A group smaller
  /// than the peers of the last read at that step means the others did not take this step:
  /// they are not presumed at the next one.
  std::vector<effect> round_done(uint64_t id, seconds now, size_t group = 0);

  /// Round `id` produced a partial average (some parts averaged, the others the own values:
  /// `settle`'s rule): stepped on as an average, but the peer's parameters now differ from its
  /// partners' as after a lone step, so with `resync_after_lone_step` a state round follows
  /// after the next update.
  std::vector<effect> round_partial(uint64_t id, seconds now, size_t group = 0);

  /// Round `id` failed (no partner, an error, the averager's own timeout).
  std::vector<effect> round_failed(uint64_t id, seconds now);

  /// State round `id` produced averaged parameters and statistics.
  std::vector<effect> state_round_done(uint64_t id, seconds now);

  /// State round `id` failed.
  std::vector<effect> state_round_failed(uint64_t id, seconds now);

  /// Download `id` loaded a state at `loaded_step`.
  std::vector<effect> download_done(uint64_t id, uint64_t loaded_step, seconds now);

  /// Download `id` failed; nothing was loaded.
  std::vector<effect> download_failed(uint64_t id, seconds now);

  /// A `wake_at` time came.
  std::vector<effect> timer(seconds now);

  /// The owner learned that `peer` left: its record stops counting now.
  std::vector<effect> peer_left(const std::string& peer, seconds now);

  /// Leaves on purpose: abandons what runs and withdraws the record.
  std::vector<effect> leave(seconds now);

  /// The phase.
  coordinator_phase phase() const noexcept { return phase_; }
  /// The global step the peer stands at (updates taken).
  uint64_t step() const noexcept { return step_; }
  /// Samples accumulated towards the next round.
  uint64_t pending_samples() const noexcept { return local_.samples(); }
  /// Samples in the round in flight (0 when none).
  uint64_t round_samples() const noexcept { return round_samples_; }
  /// An averaged update is in flight while the peer keeps computing (delayed updates).
  bool update_in_flight() const noexcept {
    return phase_ == coordinator_phase::averaging && opts_.delay_updates;
  }
  /// The local samples-per-second EMA.
  double rate() const { return local_.rate(); }
  /// The record the peer publishes at `now`.
  progress_record own_record(seconds now) const;
  /// The estimate over the last read at `now`.
  progress_estimate estimate(seconds now) const;
  /// A resync is due after the next update (the peer took a lone step since the last one).
  bool resync_due() const noexcept { return resync_due_; }
  /// Counters.
  const coordinator_stats& stats() const noexcept { return stats_; }
  /// The options.
  const coordinator_options& options() const noexcept { return opts_; }

private:
  using effects = std::vector<effect>;
  enum class round_end { averaged, own, skipped };

  void advance(seconds now, effects& out);
  void decide(seconds now, effects& out);
  void start_round_now(seconds now, effects& out);
  void step_solo(seconds now, effects& out);
  void finish_round(round_end how, seconds now, effects& out);
  void start_state_round_now(bool resync, seconds now, effects& out);
  void end_state_round(bool loaded, seconds now, effects& out);
  bool others_ask_resync(uint64_t step, seconds now) const;
  // A record read (not presumed) of another peer at `step` shows samples accumulated.
  bool samples_seen_at(uint64_t step, seconds now) const;
  void start_download(const progress_estimate& e, seconds now, effects& out);
  /// After a lone step: full-mode peers at the peer's step whose fresh (read, not presumed)
  /// records do not ask for a resync, i.e. that took the step's averaged update without it;
  /// none unless such peers outnumber those at the step that ask for one (this one included).
  std::vector<std::string> consensus_donors(seconds now) const;
  /// The round that just ended had a group as large as the peers of the last read at its step
  /// (or the owner gave no group size).
  bool whole_step_averaged(seconds now) const;
  void download_from(uint64_t step, std::vector<std::string> donors, bool resync, seconds now,
                     effects& out);
  void end_download(bool ok, uint64_t loaded_step, seconds now, effects& out);
  void pause(effects& out);
  void resume(seconds now, effects& out);
  void publish(seconds now, effects& out);
  double own_rate(seconds now) const;
  seconds publish_due() const;
  bool contributes() const noexcept { return opts_.mode != peer_mode::auxiliary; }

  std::string self_;
  coordinator_options opts_;
  progress_tracker tracker_;
  local_progress local_;
  coordinator_phase phase_ = coordinator_phase::idle;
  uint64_t step_ = 0;
  uint64_t next_id_ = 0;
  coordinator_stats stats_;
  bool paused_ = false;
  // Progress reads.
  bool has_view_ = false;
  // Some read showed another peer's record (at any step): the peer is not alone, and a view
  // showing nobody means it is cut off (or the others left), not a collaboration of one.
  bool seen_others_ = false;
  /// A round failed while the last read showed nobody else (the others left or are cut off):
  /// until a read shows another peer again, steps are lone ones without a round, which would
  /// only wait out its matchmaking window for nobody each time (in a simulated run a peer
  /// whose partner died took 3 steps in 2.8 s where its stage took 9).
  bool deserted_ = false;
  bool read_in_flight_ = false;
  seconds read_deadline_ = 0;
  seconds next_refresh_ = 0;
  seconds eta_at_ = std::numeric_limits<double>::infinity();
  // The round, state round or download in flight (one at a time: the phase says which).
  uint64_t op_id_ = 0;
  seconds op_deadline_ = 0;
  uint64_t round_step_ = 0;
  /// The group size of the round that just ended (0: unknown).
  size_t round_group_ = 0;
  /// The round being finished was a partial average.
  bool round_partial_ = false;
  uint64_t round_samples_ = 0;
  // A round of this peer's with no samples of its own failed at `step_` (its group put none in,
  // or nobody came): the rates that predicted the step were stale, so no new round at this step
  // rests on them alone (see `decide`).
  bool await_samples_ = false;
  uint64_t await_step_ = 0;
  seconds last_wake_ = -std::numeric_limits<double>::infinity();
  // When samples were last reported (or the core started): `idle_after`.
  seconds last_samples_at_ = 0;
  // Resync after a lone step: due after the next update; whether that one is the retry of a
  // failed resync; whether the state round in flight is a resync and a retry.
  bool resync_due_ = false;
  bool resync_retry_ = false;
  bool state_resync_ = false;
  bool state_retry_ = false;
  // Publishing: when the record was last published and whether new samples came since.
  seconds last_publish_ = -std::numeric_limits<double>::infinity();
  bool dirty_ = false;
};

} // namespace starling::actors::collab
