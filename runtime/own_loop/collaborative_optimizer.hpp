// A collaborative optimizer for a user's own LibTorch training loop (what `hivemind.Optimizer`
// is to PyTorch users). The user keeps their data loading, forward and backward; instead of
// `optimizer.step()` they call `step(batch_size)`, which accumulates the `.grad`s and takes the
// collaboration's global steps: when the peers of the run together processed the target batch
// size, their gradients are averaged (weights = samples) and every peer steps its optimizer on
// the same average.
//
//     auto opt = torch::optim::Adam(model->parameters(), 1e-3);
//     starling::runtime::own_loop::options o;
//     o.run = "my-run"; o.target_batch_size = 512; o.bootstrap = {"10.0.0.7:4000"};
//     auto collab = starling::runtime::own_loop::collaborative_optimizer::join(opt, o);
//     if (!collab) { std::cerr << collab.error().what << "\n"; return 1; }
//     for (auto& batch : loader) {
//       auto loss = torch::nll_loss(model->forward(batch.data), batch.target);
//       loss.backward();
//       auto s = (*collab)->step(batch.data.size(0)); // never throws
//     }
//
// Where it lives and why: it starts a starling node (actor system, DHT, averager) and so belongs
// to `runtime` (actors never depend on runtime); the header includes neither CAF nor LibTorch
// beyond a forward declaration of `torch::optim::Optimizer` (pimpl), so a user's translation
// unit pays for neither.
//
// Threads: the parameters and the optimizer belong to the user's thread. The collaboration runs
// in an actor of the node (driven by actors/collab's `peer_shell`), which touches them only
// while the user's thread waits inside `step()`; otherwise what it has for them (an averaged
// gradient, a downloaded or averaged state) waits until the next `step()` applies it. Donors
// and state rounds are served from a snapshot (parameters + optimizer state) taken after every
// change. `step()` waits at most `round_timeout` (plus a second) for a round this call started.
//
// Optimizers whose state travels (downloads, state rounds): SGD (momentum buffer), Adam and
// AdamW (without amsgrad). Parameters: fp32, on any device (copied through the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace starling::runtime::own_loop {

/// How a peer joins a run. Checked by `validate` (and by `join`).
struct options {
  /// The run's name: peers with the same name train together (the DHT key prefix).
  std::string run = "own";
  /// This peer's name in progress lines and errors.
  std::string name = "peer";
  /// Samples the whole collaboration processes per global step.
  uint64_t target_batch_size = 256;
  /// `HOST:PORT` the node listens on; port 0 lets the OS choose (`endpoint()` says which).
  std::string listen = "127.0.0.1:0";
  /// `HOST:PORT` of nodes already in the run (empty: this peer starts the run).
  std::vector<std::string> bootstrap;
  /// How long averagers gather under a step's key before its group closes (seconds).
  double matchmaking_s = 0.5;
  /// Re-form the last round's group at once for the next step while its members stay (no
  /// matchmaking window per step); a newcomer then gets in only once the group changes, stepping
  /// alone and downloading the run's state meanwhile. Off: every step's group is matched anew
  /// (each step waits `matchmaking_s`).
  bool persistent_groups = true;
  /// Deadline of one all-reduce once its group formed (seconds).
  double averaging_timeout_s = 10;
  /// A global step's round not finished this long after it started is abandoned and the peer
  /// steps on its own gradient; `step()` waits at most this long (seconds).
  double round_timeout_s = 15;
  /// A state download not finished this long after it started is abandoned (seconds).
  double download_timeout_s = 30;
  /// Average parameters and optimizer state every this many global steps (0: never; after a
  /// lone step the peers resync by a state round or a download either way).
  uint64_t average_state_every = 0;
  /// Timeout of DHT calls and of each donor request (seconds).
  double rpc_timeout_s = 5;
};

/// Checks `o`: a run name, a positive target batch size, `HOST:PORT` addresses (port 0 only
/// for `listen`), positive timeouts.
status validate(const options& o);

/// What a `step()` did.
enum class step_outcome : uint8_t {
  /// The samples were added towards the next global step; no step was taken.
  accumulating,
  /// A global step on the collaboration's averaged gradient.
  stepped_together,
  /// A global step on this peer's own gradient (its round failed, or it is alone in the run).
  stepped_alone,
  /// The collaboration's state was downloaded (this peer was behind) and loaded.
  state_downloaded,
  /// Something went wrong (`step_status::error` says what); the loop may go on.
  failed,
};

/// `accumulating`, `stepped together`, ...
const char* to_string(step_outcome o);

/// The answer of `step()`.
struct step_status {
  /// What happened.
  step_outcome outcome = step_outcome::accumulating;
  /// The global step this peer stands at now.
  uint64_t global_step = 0;
  /// Global steps taken during this call (usually 0 or 1).
  uint64_t steps_taken = 0;
  /// An averaged state (a state round) was loaded during this call.
  bool state_averaged = false;
  /// Why, when `outcome` is `failed`.
  std::string error;
  /// Why the last lone step of this call was taken alone: its averaging round's outcome and
  /// detail ("no_partner: no partner found within the matchmaking window"), or that no answer
  /// came (no round: no other peer seen; or the round timed out). Empty without a lone step.
  std::string alone_reason;
};

/// Counters since the join.
struct optimizer_stats {
  uint64_t global_step = 0;
  uint64_t steps_together = 0;
  uint64_t steps_alone = 0;
  uint64_t downloads = 0;
  uint64_t state_rounds_loaded = 0;
  uint64_t samples = 0;
};

/// The collaborative optimizer (see the file comment). Not copyable; one user thread calls it.
class collaborative_optimizer {
public:
  /// Starts a node for `o`, joins the run and wraps `opt` (which must outlive the result) and
  /// the parameters of its groups. Never throws: a bad option, an unsupported optimizer or a
  /// node that cannot start is an error value.
  static result<std::unique_ptr<collaborative_optimizer>> join(torch::optim::Optimizer& opt,
                                                               const options& o);

  /// Leaves the run (withdraws the progress record) and stops the node.
  ~collaborative_optimizer();
  collaborative_optimizer(const collaborative_optimizer&) = delete;
  collaborative_optimizer& operator=(const collaborative_optimizer&) = delete;

  /// Adds the parameters' `.grad`s (the mean over `batch_size` samples, as `loss.backward()`
  /// leaves them) towards the next global step and zeroes them; takes the global step when the
  /// collaboration is ready (waiting at most `round_timeout_s`), and first applies whatever the
  /// collaboration brought since the last call. `batch_size` 0 only polls. Never throws.
  step_status step(uint64_t batch_size) noexcept;

  /// Waits until the collaboration's progress shows `peers` peers (this one included) or
  /// `timeout_s` passed. Optional: a peer alone steps on its own gradient at once, so a run whose
  /// peers start together calls it before its loop. Never throws.
  status wait_for_peers(size_t peers, double timeout_s) noexcept;

  /// The global step this peer stands at.
  uint64_t global_step() const noexcept;

  /// Counters.
  optimizer_stats stats() const;

  /// `HOST:PORT` of this peer's node: what others pass as `bootstrap`.
  std::string endpoint() const;

  /// A digest (hex) of the parameters as they stand: equal on peers with equal parameters.
  /// Call it from the training thread.
  std::string parameters_digest() const;

  struct impl;

private:
  explicit collaborative_optimizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace starling::runtime::own_loop
