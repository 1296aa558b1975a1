#include "actors/collab/peer.hpp"

#include <utility>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/collab/settle.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"

namespace starling::actors::collab {

peer_shell::peer_shell(caf::event_based_actor* self, peer_model* model, peer_shell_options opts)
    : self_(self), model_(model), opts_(std::move(opts)) {
  // nop
}

seconds peer_shell::now() const {
  return now_s(self_);
}

void peer_shell::start(std::string id, bool sign, coordinator_options co, uint64_t step) {
  id_ = std::move(id);
  sign_ = sign;
  if (opts_.rpc_timeout.count() <= 0)
    opts_.rpc_timeout = span_of(co.read_timeout);
  core_ = std::make_unique<coordinator>(id_, std::move(co), step);
  carry(core_->start(now()));
}

void peer_shell::samples_done(uint64_t samples) {
  if (core_)
    carry(core_->samples_done(samples, now()));
}

void peer_shell::timer() {
  if (core_)
    carry(core_->timer(now()));
}

void peer_shell::reread() {
  if (core_)
    read_records();
}

void peer_shell::leave() {
  if (core_)
    carry(core_->leave(now()));
}

void peer_shell::leave(std::function<void(uint32_t)> stored) {
  if (!core_) {
    stored(0);
    return;
  }
  auto es = core_->leave(now());
  bool withdraws = false;
  for (auto& e : es)
    withdraws = withdraws || std::holds_alternative<withdraw_progress>(e);
  if (withdraws)
    on_withdrawn_ = std::move(stored);
  carry(std::move(es));
  if (!withdraws)
    stored(0);
}

void peer_shell::download_done(uint64_t id, uint64_t loaded_step) {
  if (core_)
    carry(core_->download_done(id, loaded_step, now()));
}

void peer_shell::download_failed(uint64_t id) {
  if (core_)
    carry(core_->download_failed(id, now()));
}

void peer_shell::round_done(uint64_t id, size_t group) {
  if (core_)
    carry(core_->round_done(id, now(), group));
}

void peer_shell::round_failed(uint64_t id) {
  if (core_)
    carry(core_->round_failed(id, now()));
}

// -- progress records ----------------------------------------------------------------------------

void peer_shell::put_record(std::vector<char> value, seconds expires_at) {
  put_progress_record(self_, opts_.dht, opts_.progress_key, id_, std::move(value), expires_at,
                      sign_, opts_.rpc_timeout);
}

void peer_shell::read_records() {
  read_progress_records(
    self_, opts_.dht, opts_.progress_key, id_, opts_.rpc_timeout, &blind_,
    [this](const std::vector<progress_entry>& entries) {
      if (core_)
        carry(core_->progress_read(entries, now()));
    },
    [this] {
      if (core_)
        carry(core_->progress_read_failed(now()));
    });
}

// -- gradient rounds -----------------------------------------------------------------------------

void peer_shell::take(uint64_t id, uint64_t samples) {
  auto g = model_->take_gradient(id, samples);
  auto& t = taken_[id];
  t.mean = std::move(g.mean);
  t.weight = g.weight;
}

void peer_shell::start_round(const collab::start_round& r) {
  take(r.id, r.samples);
  auto id = r.id;
  auto key = opts_.gradient_key(r.step);
  auto& t = taken_[id];
  t.key = key;
  // The averager writes into a copy; the own gradient stays the peer's (settle.hpp).
  messages::tensor_list tl;
  tl.tensors.push_back(messages::tensor_msg{averaging_input{t.mean}.for_averager(),
                                            kernels::codec_id::none, {}, {}});
  auto timeout = span_of(r.deadline - now() + 1.0);
  auto request = opts_.topk_ratio > 0
                   ? self_->request(opts_.averager, timeout, average_atom::value, std::move(key),
                                    std::move(tl), t.weight, opts_.topk_ratio,
                                    opts_.topk_error_feedback)
                   : self_->request(opts_.averager, timeout, average_atom::value, std::move(key),
                                    std::move(tl), t.weight);
  request.then(
      [this, id](messages::average_result& res) {
        using messages::round_outcome;
        auto t = taken_.find(id);
        if (!core_ || t == taken_.end() || t->second.abandoned)
          return;
        model_->answered(id, res);
        auto& rep = res.report;
        auto group = opts_.report_group ? rep.members.size() : size_t{0};
        if (opts_.auxiliary && rep.members.size() > 1
            && (rep.outcome == round_outcome::complete || rep.outcome == round_outcome::partial)) {
          // An auxiliary peer reduced for the others and applies nothing: its step is done.
          carry(core_->round_done(id, now(), group));
          return;
        }
        auto settled = settle(res, averaging_input{t->second.mean}, opts_.min_members);
        if (settled.kind != settled_kind::own) {
          averaged_[id] = settled.values;
          t->second.partial = settled.kind == settled_kind::partial;
          carry(t->second.partial ? core_->round_partial(id, now(), group)
                                  : core_->round_done(id, now(), group));
          return;
        }
        // No average: the core steps alone on the own samples or, with none, takes no step.
        if (rep.outcome == round_outcome::no_partner)
          no_partner_++;
        carry(core_->round_failed(id, now()));
      },
      [this, id](caf::error&) {
        auto t = taken_.find(id);
        if (core_ && t != taken_.end() && !t->second.abandoned)
          carry(core_->round_failed(id, now()));
      });
}

void peer_shell::step(uint64_t id, uint64_t step, bool averaged) {
  auto t = taken_.find(id);
  if (t == taken_.end())
    return;
  if (!averaged) {
    model_->step(id, step, t->second.mean, step_basis::own);
  } else if (auto a = averaged_.find(id); a != averaged_.end()) {
    model_->step(id, step, a->second,
                 t->second.partial ? step_basis::partial : step_basis::averaged);
  } else if (t->second.key.empty()) {
    // A round the model ran itself keeps its own average.
    model_->step(id, step, at::Tensor{}, step_basis::averaged);
  } else {
    model_->step(id, step, t->second.mean, step_basis::own); // cannot happen: kept at the answer
  }
  taken_.erase(id);
  averaged_.erase(id);
}

// -- state rounds --------------------------------------------------------------------------------

void peer_shell::start_state_round(const collab::start_state_round& r) {
  auto id = r.id;
  auto key = opts_.state_key(r.step);
  state_rounds_[id] = state_round{r.step, r.resync, key};
  auto v = model_->state_vector();
  if (!v) {
    state_rounds_.erase(id);
    model_->state_round_ended(id, r.step, r.resync, false);
    carry(core_->state_round_failed(id, now()));
    return;
  }
  averaging_input in{*v};
  messages::tensor_list tl;
  tl.tensors.push_back(messages::tensor_msg{in.for_averager(), kernels::codec_id::none, {}, {}});
  self_
    ->request(opts_.averager, span_of(r.deadline - now() + 1.0), average_atom::value, key,
              std::move(tl), 1.0)
    .then(
      [this, id, in](messages::average_result& res) {
        auto sr = state_rounds_.find(id);
        if (sr == state_rounds_.end())
          return;
        sr->second.key.clear(); // answered: nothing left to cancel
        if (!core_ || abandoned_.count(id) > 0)
          return;
        model_->answered(id, res);
        auto settled = settle(res, in);
        if (settled.kind != settled_kind::own) {
          state_results_[id] = settled.values;
          carry(core_->state_round_done(id, now()));
          return;
        }
        auto info = sr->second;
        state_rounds_.erase(sr);
        model_->state_round_ended(id, info.step, info.resync, false);
        carry(core_->state_round_failed(id, now()));
      },
      [this, id](caf::error&) {
        auto sr = state_rounds_.find(id);
        if (sr == state_rounds_.end())
          return;
        sr->second.key.clear();
        if (!core_ || abandoned_.count(id) > 0)
          return;
        auto info = sr->second;
        state_rounds_.erase(sr);
        model_->state_round_ended(id, info.step, info.resync, false);
        carry(core_->state_round_failed(id, now()));
      });
}

// -- effects -------------------------------------------------------------------------------------

void peer_shell::carry(std::vector<effect> es) {
  for (auto& e : es) {
    if (auto* p = std::get_if<publish_progress>(&e)) {
      put_record(std::move(p->value), p->expires_at);
    } else if (auto* w = std::get_if<withdraw_progress>(&e)) {
      if (on_withdrawn_) {
        put_progress_record(self_, opts_.dht, opts_.progress_key, id_, std::move(w->value),
                            w->expires_at, sign_, opts_.rpc_timeout, std::move(on_withdrawn_));
        on_withdrawn_ = {};
      } else {
        put_record(std::move(w->value), w->expires_at);
      }
    } else if (std::holds_alternative<read_progress>(e)) {
      read_records();
    } else if (auto* wk = std::get_if<wake_at>(&e)) {
      model_->wake_in(wake_delay(wk->at, now()));
    } else if (auto* r = std::get_if<collab::start_round>(&e)) {
      start_round(*r);
    } else if (auto* sa = std::get_if<step_alone>(&e)) {
      take(sa->id, sa->samples);
      step(sa->id, sa->step, false);
    } else if (auto* ab = std::get_if<abandon_round>(&e)) {
      if (auto i = taken_.find(ab->id); i != taken_.end()) {
        i->second.abandoned = true;
        if (!i->second.key.empty())
          self_->send(opts_.averager, average_atom::value, stop_atom::value, i->second.key);
      }
    } else if (auto* ap = std::get_if<apply_averaged>(&e)) {
      step(ap->id, ap->step, true);
    } else if (auto* own = std::get_if<step_own>(&e)) {
      step(own->id, own->step, false);
    } else if (auto* sk = std::get_if<skip_step>(&e)) {
      if (taken_.count(sk->id) > 0)
        model_->skipped(sk->id);
      taken_.erase(sk->id);
      averaged_.erase(sk->id);
    } else if (std::holds_alternative<pause_compute>(e)) {
      model_->pause();
    } else if (std::holds_alternative<resume_compute>(e)) {
      model_->resume();
    } else if (auto* sr = std::get_if<collab::start_state_round>(&e)) {
      start_state_round(*sr);
    } else if (auto* ls = std::get_if<load_averaged_state>(&e)) {
      auto info = state_rounds_.find(ls->id);
      if (auto i = state_results_.find(ls->id); i != state_results_.end()) {
        auto loaded = model_->load_state_vector(i->second);
        state_results_.erase(i);
        if (info != state_rounds_.end())
          model_->state_round_ended(ls->id, info->second.step, info->second.resync, loaded.ok());
      }
      if (info != state_rounds_.end())
        state_rounds_.erase(info);
    } else if (auto* as = std::get_if<abandon_state_round>(&e)) {
      abandoned_.insert(as->id);
      if (auto i = state_rounds_.find(as->id); i != state_rounds_.end()) {
        if (!i->second.key.empty())
          self_->send(opts_.averager, average_atom::value, stop_atom::value, i->second.key);
        auto info = i->second;
        state_rounds_.erase(i);
        model_->state_round_ended(as->id, info.step, info.resync, false);
      }
    } else if (auto* d = std::get_if<download_state>(&e)) {
      model_->download(*d);
    } else if (auto* ad = std::get_if<abandon_download>(&e)) {
      abandoned_.insert(ad->id);
      model_->download_abandoned(ad->id);
    } else if (std::holds_alternative<discard_gradients>(e)) {
      model_->discard_gradients();
    }
  }
}

} // namespace starling::actors::collab
