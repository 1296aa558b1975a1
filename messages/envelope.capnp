# The outer message of everything starling sends between nodes: every message type that crosses
# processes is written into one Envelope by its CAF `inspect` (messages/enveloped.hpp) and checked
# on arrival (version, experiment, sender, sequence and time, sizes and every field's range).
# The compatibility rule (which changes keep protocolVersion, which bump it) is in
# messages/README.md.
@0x983045383fbef779;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

using import "tensor.capnp".Tensor;
using import "dht.capnp".DhtMessage;
using import "averager.capnp".AveragerMessage;
using import "stage.capnp".StageMessage;
using import "vi.capnp".ViMessage;
using import "transfer.capnp".TransferMessage;

# Liveness probe; the receiver echoes `seq`.
struct Ping {
  seq @0 :UInt64;          # sequence number chosen by the sender
  origin @1 :Text;         # the sender node's name, at most 256 bytes
}

# An opaque byte payload with a tag naming its schema.
struct Blob {
  tag @0 :Text;            # at most 256 bytes
  bytes @1 :Data;          # at most 256 MiB
}

# A metric event a role reports, forwarded between nodes' sinks (messages/metrics.hpp).
struct MetricEvent {
  source @0 :Text;               # at most 256 bytes
  kind @1 :Text;                 # at most 256 bytes
  values @2 :List(NumberEntry);  # at most 1024, keys unique
  labels @3 :List(LabelEntry);   # at most 1024, keys unique
  t @4 :Float64;                 # run time in seconds (negative until a sink stamped it)
}

struct NumberEntry {
  key @0 :Text;                  # at most 256 bytes
  value @1 :Float64;
}

struct LabelEntry {
  key @0 :Text;                  # at most 256 bytes
  value @1 :Text;                # at most 4 KiB
}

struct Envelope {
  protocolVersion @0 :UInt16;
  # Wire protocol version of the sender; a receiver rejects versions it does not speak.

  experimentId @1 :Text;
  # The training run this message belongs to; messages of other runs are rejected.

  senderPeerId @2 :Data;
  # The sender's peer id (BLAKE2b-160 of its node key, = its DHT id); empty from a node without
  # an identity (tools, tests).

  payload :union {
    # What the message carries: one schema per protocol.
    tensor @3 :Tensor;     # one tensor (gradients, parameters, activations...)
    ping @4 :Ping;         # liveness probe
    dht @7 :DhtMessage;
    averager @8 :AveragerMessage;
    stage @9 :StageMessage;
    vi @10 :ViMessage;     # MASHA
    transfer @11 :TransferMessage;
    blob @12 :Blob;
    metric @13 :MetricEvent;
  }

  sequence @5 :UInt64;
  # Per sender, increasing: starts at the sender's clock in ns when it starts (so a restarted
  # node continues above its old numbers) and counts up by one per envelope. Receivers keep a
  # window per sender and refuse a number seen before (a replay).

  sendTimeNs @6 :Int64;
  # The sender's clock (Unix ns); receivers refuse envelopes too far from their own clock.
}
