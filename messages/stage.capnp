# The SWARM stage protocol (messages/swarm.hpp): forward and backward passes, and state downloads.
# A tensor that may be absent is a pointer left unset.
@0xec5d68d8f75006b7;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

using import "tensor.capnp".Tensor;

struct StageForward {
  input @0 :Tensor;
  targets @1 :Tensor;
  seed @2 :UInt64;
}

struct StageBackward {
  input @0 :Tensor;
  gradOutput @1 :Tensor;
  targets @2 :Tensor;
  seed @3 :UInt64;
  microbatchId @4 :UInt64;      # the trainer's id of the microbatch (retries keep it)
  attempt @5 :UInt32;           # 0 for the first try, +1 per retry
}

struct StageBackwardReply {
  gradInput @0 :Tensor;
  loss @1 :Float64;
}

struct StageState {
  params @0 :Tensor;
  moments @1 :Tensor;
  optimizerSteps @2 :List(UInt64);   # at most 2^20
  steps @3 :UInt64;
  samples @4 :UInt64;
  modeledBytes @5 :UInt64;      # the state a cost-model peer stands for; at most 2^50 (the
                                # zero bytes themselves follow the envelope, see swarm.hpp)
  buffers @6 :Tensor;           # float buffers (running statistics), flat fp32; protocol 4
  intBuffers @7 :Tensor;        # integer buffers (num_batches_tracked), flat int64; protocol 4
  packedMoments @8 :Data;       # the optimizer's compact state instead of `moments` (lamb8's
                                # codes and scales, kernels/optim/quant8.hpp); protocol 5
}

struct StageStatePart {
  steps @0 :UInt64;
  samples @1 :UInt64;
  part @2 :UInt64;              # < parts
  parts @3 :UInt64;             # 1 .. 65536
  paramsNumel @4 :UInt64;       # at most 2^40
  paramsDtype @5 :Int32;        # c10::ScalarType, 0 .. 63
  momentsNumel @6 :UInt64;      # at most 2^41
  optimizerSteps @7 :List(UInt64);
  digest @8 :Data;              # empty or 32 bytes
  params @9 :Tensor;
  moments @10 :Tensor;
  modeledBytes @11 :UInt64;     # this part's share of the modeled state; at most 2^50
  buffers @12 :Tensor;          # the whole state's float buffers (small: in every part)
  intBuffers @13 :Tensor;       # the whole state's integer buffers (in every part)
  packedBytes @14 :UInt64;      # bytes of the whole compact optimizer state; at most 2^42
  packedMoments @15 :Data;      # this part's slice of it; protocol 5
}

struct StageMessage {
  union {
    forward @0 :StageForward;
    backward @1 :StageBackward;
    backwardReply @2 :StageBackwardReply;
    state @3 :StageState;
    statePart @4 :StageStatePart;
  }
}
