// Checkpoints of a stage's state on disk, so that the stage's learned parameters outlive its
// peers: when every peer of a stage is gone at once, a restarted peer finds no live donor and
// resumes from the newest checkpoint it can read instead of the seeded initialization.
//
// A checkpoint is one file per (stage, layer range, step, time, peer) in a run directory,
// written atomically (a temporary file in the same directory, fsync, rename, fsync of the
// directory), so a reader sees a whole file or none. The file is a fixed header (magic, format
// version, stage, layer range, step, time, payload size, BLAKE2b-256 digest of the state as
// `state_digest` computes it) and the state as a Cap'n Proto `stage.state` envelope, the bytes a
// donor would send. Reading checks everything (magic, version, key, size, the envelope's every
// field) and recomputes the digest: a truncated or corrupt file is rejected with its reason and
// the next-newest is tried. Pure: no CAF.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::stage {

/// Which state a checkpoint holds: a stage index and its layer range [begin, end).
struct checkpoint_key {
  /// Stage index in the pipeline.
  uint64_t stage = 0;
  /// First layer (block) of the stage.
  int64_t begin = 0;
  /// One past the last layer.
  int64_t end = 1;
};

/// A checkpoint file seen in a directory (from its name; the contents are checked on reading).
struct checkpoint_file {
  /// Full path.
  std::string path;
  /// Optimizer steps of the state (global steps of the stage).
  uint64_t steps = 0;
  /// When it was written, in nanoseconds of the writer's clock (CAF's: virtual in simulation).
  uint64_t time_ns = 0;
  /// The peer that wrote it.
  std::string peer;
};

/// What writing a checkpoint cost.
struct checkpoint_written {
  /// Where it went.
  std::string path;
  /// File size.
  uint64_t bytes = 0;
  /// Wall-clock seconds of encoding, hashing, writing and syncing.
  double seconds = 0;
  /// BLAKE2b-256 of the state (`state_digest`), raw 32 bytes.
  std::string digest;
};

/// A checkpoint read back and verified.
struct checkpoint_loaded {
  /// The file.
  checkpoint_file file;
  /// The state (parameters, optimizer moments and steps, step count; `samples` is 0).
  messages::stage_state state;
  /// Its digest, verified against the bytes read.
  std::string digest;
};

/// The newest readable checkpoint of a key, and why the newer ones were not.
struct checkpoint_search {
  /// The newest checkpoint that read and verified, if any.
  std::optional<checkpoint_loaded> found;
  /// One line per rejected file ("<path>: truncated: 100 of 2048 bytes").
  std::vector<std::string> rejected;
};

/// The file name of a checkpoint (`stage<k>-l<b>-<e>-step<N>-t<ns>-<peer>.ckpt`); `peer` must be
/// non-empty and made of letters, digits, '_', '.' and '-' only (checked by `write_checkpoint`).
std::string checkpoint_name(const checkpoint_key& key, uint64_t steps, uint64_t time_ns,
                            const std::string& peer);

/// Writes `s` as a checkpoint of `key` by `peer` at time `time_ns` into `dir` (created when
/// missing), atomically. Fails, saying why, on an invalid peer name, a state without parameters,
/// or any I/O error (the temporary file is then removed).
result<checkpoint_written> write_checkpoint(const std::string& dir, const checkpoint_key& key,
                                            const std::string& peer, uint64_t time_ns,
                                            const messages::stage_state& s);

/// Reads and verifies the checkpoint at `path`, which must belong to `key`: fails, saying why,
/// on an unreadable file, a bad magic or version, another key, a size that disagrees with the
/// header (truncated or padded), an envelope that does not decode, or a digest mismatch.
result<checkpoint_loaded> read_checkpoint(const std::string& path, const checkpoint_key& key);

/// The checkpoints of `key` in `dir` by their names, newest first (most steps, then latest
/// time, then path); none when `dir` does not exist. Other files are ignored.
std::vector<checkpoint_file> list_checkpoints(const std::string& dir, const checkpoint_key& key);

/// The newest checkpoint of `key` in any of `dirs` that reads and verifies and that `accept`
/// (when set) takes; each newer one that did not is named in `rejected` with its reason.
checkpoint_search
newest_checkpoint(const std::vector<std::string>& dirs, const checkpoint_key& key,
                  const std::function<status(const checkpoint_loaded&)>& accept = {});

/// Removes `peer`'s checkpoints of `key` in `dir` except the `keep` newest (at least one is
/// kept); returns how many it removed. Other peers' files are left alone.
size_t prune_checkpoints(const std::string& dir, const checkpoint_key& key, const std::string& peer,
                         size_t keep);

/// A stage peer's gradient accumulated towards its next optimizer step, saved when the peer is
/// stopped on purpose (a stopped run's batches that were done but not yet stepped on), so that
/// the peer of the same slot that resumes at that step takes it up instead of losing it.
struct pending_gradient {
  /// The step the gradient was computed at (its parameters' step).
  uint64_t step = 0;
  /// Samples and microbatches in it.
  uint64_t samples = 0;
  uint64_t microbatches = 0;
  /// The flat sum of the microbatches' gradients (fp32).
  at::Tensor sum;
};

/// The folder of pending gradients inside a checkpoint folder.
std::string pending_dir(const std::string& checkpoint_dir);

/// Writes `g` for `slot` (a name that stays the same across the peer's generations, e.g.
/// `s2p5`) into `pending_dir(checkpoint_dir)`, atomically and verified like a checkpoint (the
/// same file format: header, digest, a `stage.state` envelope whose parameters are the sum, step
/// the step, optimizer steps [samples, microbatches]), replacing the slot's older ones.
result<checkpoint_written> write_pending_gradient(const std::string& checkpoint_dir,
                                                  const checkpoint_key& key,
                                                  const std::string& slot, uint64_t time_ns,
                                                  const pending_gradient& g);

/// What taking up a slot's pending gradient found.
struct pending_taken {
  /// The gradient, when the newest file of the slot verified and was saved at `step`.
  std::optional<pending_gradient> gradient;
  /// Files of the slot read and removed: taken, stale (another step) or rejected (why).
  std::vector<std::string> notes;
};

/// Takes up `slot`'s pending gradient of `key` at `step` from the pending folders of `dirs`
/// (checkpoint folders): the newest one that verifies, if it was saved at `step`. Every file of
/// the slot found is removed, taken or not, so that a gradient enters the model at most once.
pending_taken take_pending_gradient(const std::vector<std::string>& dirs,
                                    const checkpoint_key& key, const std::string& slot,
                                    uint64_t step);

/// The digest as lowercase hex (logs, reports).
std::string digest_hex(const std::string& digest);

} // namespace starling::actors::stage
