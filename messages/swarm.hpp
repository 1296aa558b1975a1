// Messages of SWARM pipeline training: trainers ask stage peers for forward and backward passes;
// a new stage peer downloads its state from a live one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/atom.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/serializer.hpp>

#include "messages/enveloped.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::messages {

/// Forward pass request: the stage's input (tokens for the first stage, activations otherwise),
/// the targets (used by the last stage only) and the microbatch's dropout seed.
struct stage_forward {
  tensor_msg input;
  tensor_msg targets;
  uint64_t seed = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<stage_forward> {
  static constexpr const char* name = "stage.forward";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const stage_forward& x);
  static status read(const payload_reader& r, stage_forward& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_forward& x) {
  return inspect_enveloped(f, x, "stage_forward", [&] {
    return f(caf::meta::type_name("stage_forward"), x.input, x.targets, x.seed);
  });
}

/// `(commit_atom, uint64 microbatch_id, uint32 attempt)`, trainer → stage peer, one-way: the
/// trainer used this attempt's backward reply, so the peer applies its gradient (exactly once; a
/// gradient never confirmed is dropped and counted as lost work). `(status_atom, commit_atom)`
/// asks a peer for its counters, `(get_atom, commit_atom)` for its applications per microbatch.
using commit_atom = caf::atom_constant<caf::atom("commit")>;

/// Backward pass request: the stage recomputes its forward on `input` (it keeps nothing between
/// forward and backward), back-propagates `grad_output` (undefined for the last stage, whose
/// output is the loss) and accumulates parameter gradients.
struct stage_backward {
  tensor_msg input;
  tensor_msg grad_output;
  tensor_msg targets;
  uint64_t seed = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
  /// The trainer's id of the microbatch; every retry of it keeps the id (so that a stage can
  /// count a microbatch's gradient exactly once).
  uint64_t microbatch_id = 0;
  /// 0 for the first try of this backward, +1 for each retry.
  uint32_t attempt = 0;
};

template <>
struct wire_codec<stage_backward> {
  static constexpr const char* name = "stage.backward";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const stage_backward& x);
  static status read(const payload_reader& r, stage_backward& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_backward& x) {
  return inspect_enveloped(f, x, "stage_backward", [&] {
    return f(caf::meta::type_name("stage_backward"), x.input, x.grad_output, x.targets, x.seed,
             x.microbatch_id, x.attempt);
  });
}

/// Answer to a backward request: the gradient for the previous stage (undefined for the first
/// stage) and the recomputed loss (last stage only, else 0).
struct stage_backward_reply {
  tensor_msg grad_input;
  double loss = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<stage_backward_reply> {
  static constexpr const char* name = "stage.backward_reply";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const stage_backward_reply& x);
  static status read(const payload_reader& r, stage_backward_reply& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_backward_reply& x) {
  return inspect_enveloped(f, x, "stage_backward_reply", [&] {
    return f(caf::meta::type_name("stage_backward_reply"), x.grad_input, x.loss);
  });
}

/// State bytes a sender stands for but does not hold (a cost-model stage peer's parameters and
/// optimizer state): serialized as `size` zero bytes, so that a transfer costs the network what
/// the real state would while the process holds only the count; decoding reads past them.
struct modeled_bytes {
  uint64_t size = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, modeled_bytes& x) {
  constexpr uint64_t block = 65536;
  if constexpr (std::is_base_of<caf::serializer, Inspector>::value) {
    static const char zeros[block] = {};
    if (auto err = f(caf::meta::type_name("modeled_bytes"), x.size))
      return err;
    for (uint64_t left = x.size; left > 0;) {
      auto n = std::min(left, block);
      if (auto err = f.apply_raw(static_cast<size_t>(n), const_cast<char*>(zeros)))
        return err;
      left -= n;
    }
    return caf::none;
  } else if constexpr (std::is_base_of<caf::deserializer, Inspector>::value) {
    if (auto err = f(caf::meta::type_name("modeled_bytes"), x.size))
      return err;
    std::vector<char> scratch(static_cast<size_t>(std::min(x.size, block)));
    for (uint64_t left = x.size; left > 0;) { // a short buffer fails here, never over-reads
      auto n = std::min(left, block);
      if (auto err = f.apply_raw(static_cast<size_t>(n), scratch.data()))
        return err;
      left -= n;
    }
    return caf::none;
  } else {
    return f(caf::meta::type_name("modeled_bytes"), x.size);
  }
}

/// The body of `inspect` for the state messages: the envelope (which carries `modeled.size`,
/// range-checked like every field), then the modeled bytes themselves right after it (they are
/// zeros: in the envelope they would have to exist in memory on both sides). On arrival the
/// padding is read past and the size taken from the envelope, also when it was refused (the
/// message then arrives marked, its size 0).
template <class Inspector, class T, class Fields>
typename Inspector::result_type inspect_with_modeled(Inspector& f, T& x, const char* type_name,
                                                     Fields&& fields) {
  if constexpr (std::is_base_of<caf::serializer, Inspector>::value) {
    if (auto err = inspect_enveloped(f, x, type_name, fields))
      return err;
    return inspect(f, x.modeled);
  } else if constexpr (std::is_base_of<caf::deserializer, Inspector>::value) {
    if (auto err = inspect_enveloped(f, x, type_name, fields))
      return err;
    modeled_bytes padding;
    return inspect(f, padding);
  } else {
    return fields();
  }
}

/// A stage peer's full state for a newcomer: flat parameters, optimizer state in a canonical
/// form (equal states are equal bit for bit, whichever peer holds them), steps taken.
struct stage_state {
  tensor_msg params;
  /// The optimizer's first then second moments, flat fp32 in parameter order (twice the
  /// parameters' element count), and each parameter tensor's step count (0: no state yet).
  tensor_msg moments;
  std::vector<uint64_t> optimizer_steps;
  uint64_t steps = 0;
  uint64_t samples = 0;
  /// The state a cost-model peer stands for (0 for a real model's peer).
  modeled_bytes modeled;
  /// The model's floating-point buffers (batch norm's running statistics), flat fp32 in module
  /// order: averaged in state rounds like the parameters. Unset for a model without them.
  tensor_msg buffers;
  /// The model's integer buffers (`num_batches_tracked`), flat int64: the donor's, never
  /// averaged. Unset for a model without them.
  tensor_msg int_buffers;
  /// The optimizer's compact state in place of `moments` (then unset), for an optimizer that has
  /// one: lamb8's codes and scales (kernels/optim/quant8.hpp), untrusted bytes that only the
  /// optimizer's validating decoder reads. Empty otherwise. Protocol 5.
  std::string packed_moments;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<stage_state> {
  static constexpr const char* name = "stage.state";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const stage_state& x);
  static status read(const payload_reader& r, stage_state& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_state& x) {
  return inspect_with_modeled(f, x, "stage_state", [&] {
    return f(caf::meta::type_name("stage_state"), x.params, x.moments, x.optimizer_steps, x.steps,
             x.samples, x.modeled, x.buffers, x.int_buffers, x.packed_moments);
  });
}

/// One part of a stage peer's state, for a newcomer that downloads from several donors at once:
/// part `part` of `parts` of the flat parameters and of the flat optimizer moments, each cut
/// into near-equal contiguous slices, with the sizes and the digest of the whole so that the
/// parts of several donors are put together only when they are one and the same state.
struct stage_state_part {
  uint64_t steps = 0;
  uint64_t samples = 0;
  uint64_t part = 0;
  uint64_t parts = 1;
  /// Elements of the whole flat parameter vector, and its dtype (`c10::ScalarType` as int).
  uint64_t params_numel = 0;
  int32_t params_dtype = 0;
  /// Elements of the whole flat moment vector (fp32).
  uint64_t moments_numel = 0;
  /// The whole state's per-parameter optimizer step counts (small: sent in every part).
  std::vector<uint64_t> optimizer_steps;
  /// BLAKE2b-256 of the whole state (parameter and moment bytes, step counts, step).
  std::string digest;
  /// This part's slices of the parameters and of the moments.
  tensor_msg params;
  tensor_msg moments;
  /// This part's share of the modeled state (see `modeled_bytes`).
  modeled_bytes modeled;
  /// The whole state's buffers (small: every part carries them; see `stage_state`).
  tensor_msg buffers;
  tensor_msg int_buffers;
  /// Bytes of the whole compact optimizer state (`stage_state::packed_moments`; 0: none), and
  /// this part's slice of them.
  uint64_t packed_bytes = 0;
  std::string packed_moments;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<stage_state_part> {
  static constexpr const char* name = "stage.state_part";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const stage_state_part& x);
  static status read(const payload_reader& r, stage_state_part& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_state_part& x) {
  return inspect_with_modeled(f, x, "stage_state_part", [&] {
    return f(caf::meta::type_name("stage_state_part"), x.steps, x.samples, x.part, x.parts,
             x.params_numel, x.params_dtype, x.moments_numel, x.optimizer_steps, x.digest, x.params,
             x.moments, x.modeled, x.buffers, x.int_buffers, x.packed_bytes, x.packed_moments);
  });
}

/// A refused stage message also marks its tensors, so an actor that checks `tensor.ok()` answers
/// with the reason instead of computing on undefined tensors.
inline void mark_refused(stage_forward& x, const std::string& why) {
  x.wire_error = x.input.error = x.targets.error = why;
}

/// See `mark_refused(stage_forward&, ...)`.
inline void mark_refused(stage_backward& x, const std::string& why) {
  x.wire_error = x.input.error = x.grad_output.error = x.targets.error = why;
}

/// See `mark_refused(stage_forward&, ...)`.
inline void mark_refused(stage_backward_reply& x, const std::string& why) {
  x.wire_error = x.grad_input.error = why;
}

/// See `mark_refused(stage_forward&, ...)`.
inline void mark_refused(stage_state& x, const std::string& why) {
  x.wire_error = x.params.error = x.moments.error = x.buffers.error = x.int_buffers.error = why;
}

/// See `mark_refused(stage_forward&, ...)`.
inline void mark_refused(stage_state_part& x, const std::string& why) {
  x.wire_error = x.params.error = x.moments.error = x.buffers.error = x.int_buffers.error = why;
}

} // namespace starling::messages
