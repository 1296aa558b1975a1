// The collaborative optimizer's shell: the one interpreter of the coordinator's effects
// (coordinator.hpp) for every kind of peer that trains with a collaboration — a SWARM stage peer
// and a data-parallel peer today, a BTARD peer next. It owns what the core asks for: the
// progress records (DHT puts and reads), the timers, the gradient and state averaging requests
// and their answers (the rule of settle.hpp), lone steps, resyncs, downloads given up, the
// tombstone on leave. What it does not own — the model's gradients, parameters and optimizer,
// where a state comes from, what a step reports — it asks of a `peer_model`, synchronously, in
// the model's own actor: the shell is a member of that actor's state, so no tensor is touched
// by two actors.
//
// Protocol (the messages the shell sends and the answers it expects):
//   to the DHT:       `dht::make_subkey_put` of the progress record, `dht_get` of the key;
//   to the averager:  `(average_atom, key, tensor_list, weight) -> average_result` per gradient
//                     round (key `gradient_key(step)`) and state round (`state_key(step)`),
//                     `(average_atom, stop_atom, key)` to cancel one;
//   to itself:        `(collab_reread_atom)` after a blind read (the owner routes it to
//                     `reread()`), and the owner's own wake-up message (`peer_model::wake_in`),
//                     routed to `timer()`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/collab/coordinator.hpp"
#include "actors/collab/shell.hpp"
#include "kernels/result.hpp"

namespace starling::messages {
struct average_result;
} // namespace starling::messages

namespace starling::actors::collab {

/// What a step stepped on.
enum class step_basis : uint8_t {
  /// The round's complete average.
  averaged,
  /// A partial average: whole parts averaged, the others the own values (settle.hpp).
  partial,
  /// The peer's own gradient (the round failed, or the peer stepped alone).
  own,
};

/// A gradient taken out for a round.
struct taken_gradient_ref {
  /// The step's own mean gradient (the averager gets a copy).
  at::Tensor mean;
  /// Its weight in the average.
  double weight = 0;
};

/// What the shell asks of the model it drives. Every call happens in the model's actor.
class peer_model {
public:
  virtual ~peer_model() = default;

  /// Takes round `id`'s gradient out of the accumulation (later backwards accumulate towards
  /// the next step): its mean over the `samples` the core counted, and its weight.
  virtual taken_gradient_ref take_gradient(uint64_t id, uint64_t samples) = 0;

  /// Takes global step `step` for round `id` on `grad`: the round's average (undefined when
  /// none was kept) or, with `basis` own, the own mean taken out for it.
  virtual void step(uint64_t id, uint64_t step, const at::Tensor& grad, step_basis basis) = 0;

  /// Round `id`'s gradient was dropped without a step.
  virtual void skipped(uint64_t id) {}

  /// The state vector (parameters and optimizer statistics) a state round averages.
  virtual result<at::Tensor> state_vector() = 0;

  /// Loads an averaged state vector (all or nothing).
  virtual status load_state_vector(const at::Tensor& v) = 0;

  /// Drops the accumulated gradient.
  virtual void discard_gradients() = 0;

  /// Stops and restarts computing (`pause_compute`, `resume_compute`).
  virtual void pause() {}
  virtual void resume() {}

  /// Downloads a state as `d` says; answers the shell's `download_done` or `download_failed`
  /// unless `abandoned(d.id)` by then.
  virtual void download(const download_state& d) = 0;

  /// The core gave up on download `id`.
  virtual void download_abandoned(uint64_t id) {}

  /// Delivers the owner's wake-up message to itself in `delay` (routed to `peer_shell::timer`).
  virtual void wake_in(caf::timespan delay) = 0;

  /// Every answer of the averager to gradient or state round `id` that the core still waits
  /// for, before the shell uses it.
  virtual void answered(uint64_t id, const messages::average_result& res) {}

  /// State round `id` for `step` ended, its average loaded or not.
  virtual void state_round_ended(uint64_t id, uint64_t step, bool resync, bool loaded) {}
};

/// Where the shell's messages go and how it names things.
struct peer_shell_options {
  /// The node's DHT and averager.
  caf::actor dht;
  caf::actor averager;
  /// DHT key of the collaboration's progress records.
  std::string progress_key;
  /// Averager group keys of the gradient and state rounds of a step.
  std::function<std::string(uint64_t step)> gradient_key;
  std::function<std::string(uint64_t step)> state_key;
  /// A gradient round whose group had fewer members is no average (settle's `min_members`).
  size_t min_members = 1;
  /// Tell the core the group size of an averaged round (it presumes those peers at the new
  /// step); 0 tells it nothing.
  bool report_group = false;
  /// An auxiliary peer: a round it reduced in is done, with nothing to apply.
  bool auxiliary = false;
  /// Timeout of DHT puts and reads (0: the core's `read_timeout`).
  caf::timespan rpc_timeout{0};
  /// Gradient rounds as Top-k rounds of the averager (averager.hpp; DiLoCo's pseudo-gradients,
  /// which the model hands over sparse already): the fraction each reducer keeps of its part,
  /// 0 for dense rounds.
  double topk_ratio = 0;
  /// Top-k rounds: the reducers' error feedback on their re-sparsified parts.
  bool topk_error_feedback = false;
};

/// The shell (see the file comment). A member of the model's actor state.
class peer_shell {
public:
  peer_shell(caf::event_based_actor* self, peer_model* model, peer_shell_options opts);

  /// Starts the core under record id `id` (signed records when `sign`) at `step`.
  void start(std::string id, bool sign, coordinator_options co, uint64_t step = 0);

  /// Whether the core runs.
  bool running() const noexcept { return core_ != nullptr; }

  /// The core (null before `start`).
  coordinator* core() noexcept { return core_.get(); }
  const coordinator* core() const noexcept { return core_.get(); }

  /// Events for the core (each does nothing before `start`).
  void samples_done(uint64_t samples);
  void timer();
  void reread();
  void leave();
  /// Leaves, and calls `stored` with how many DHT nodes acknowledged the withdrawn record (0:
  /// none did, or the peer had published none); the caller stays alive until then.
  void leave(std::function<void(uint32_t)> stored);
  void download_done(uint64_t id, uint64_t loaded_step);
  void download_failed(uint64_t id);
  void round_done(uint64_t id, size_t group = 0);
  void round_failed(uint64_t id);

  /// Carries out the core's effects.
  void carry(std::vector<effect> es);

  /// The core gave up on state round or download `id`.
  bool abandoned(uint64_t id) const { return abandoned_.count(id) > 0; }

  /// Whether the core still waits for gradient round `id` (not abandoned, not stepped yet).
  bool round_live(uint64_t id) const {
    auto t = taken_.find(id);
    return t != taken_.end() && !t->second.abandoned;
  }

  /// Gradient rounds whose averager found nobody.
  uint64_t no_partner() const noexcept { return no_partner_; }

  /// Now on the core's clock.
  seconds now() const;

private:
  void put_record(std::vector<char> value, seconds expires_at);
  void read_records();
  void take(uint64_t id, uint64_t samples);
  void start_round(const start_round& r);
  void step(uint64_t id, uint64_t step, bool averaged);
  void start_state_round(const start_state_round& r);

  /// A gradient taken out for round `id`, until its step or skip.
  struct taken_round {
    at::Tensor mean;
    double weight = 0;
    /// The round's group key (a cancel names it); empty for a round the model runs itself.
    std::string key;
    bool abandoned = false;
    bool partial = false;
  };

  /// A state round in flight.
  struct state_round {
    uint64_t step = 0;
    bool resync = false;
    std::string key;
  };

  caf::event_based_actor* self_;
  peer_model* model_;
  peer_shell_options opts_;
  std::unique_ptr<coordinator> core_;
  std::string id_;
  /// Called when the withdrawn record of a leave was stored (see `leave(stored)`).
  std::function<void(uint32_t)> on_withdrawn_;
  bool sign_ = false;
  blind_reads blind_;
  std::map<uint64_t, taken_round> taken_;
  std::map<uint64_t, at::Tensor> averaged_;
  std::map<uint64_t, state_round> state_rounds_;
  std::map<uint64_t, at::Tensor> state_results_;
  std::set<uint64_t> abandoned_;
  uint64_t no_partner_ = 0;
};

} // namespace starling::actors::collab
