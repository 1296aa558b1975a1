# The outer message of everything starling sends between nodes. Later issues add payloads to the
# union; a receiver that does not know a payload sees `which()` outside its known set and rejects
# the message with an error value.
@0x983045383fbef779;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

using import "tensor.capnp".Tensor;

# Liveness probe; the receiver echoes `seq`.
struct Ping {
  seq @0 :UInt64;          # sequence number chosen by the sender
}

struct Envelope {
  protocolVersion @0 :UInt16;
  # Wire protocol version of the sender; a receiver rejects versions it does not speak.

  experimentId @1 :Text;
  # The training run this message belongs to; messages of other runs are rejected.

  senderPeerId @2 :Data;
  # The sender's peer id (its public key or a hash of it), as announced in the DHT.

  payload :union {
    # What the message carries.
    tensor @3 :Tensor;     # one tensor (gradients, parameters, activations...)
    ping @4 :Ping;         # liveness probe
  }
}
