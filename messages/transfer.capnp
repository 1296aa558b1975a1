# Transfer control (messages/direct.hpp, messages/chunked.hpp): the direct data channel's
# announce/endpoint/report and the chunked transfer's chunks and acks.
@0xd7619d5669c02441;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

struct DirectAnnounce {
  token @0 :Data;               # empty or 16 bytes
  totalBytes @1 :UInt64;        # at most 2^31
  dtype @2 :UInt8;              # kernels::wire_dtype
  shape @3 :List(Int64);        # at most 64 dims, each >= 0
  codec @4 :UInt8;              # kernels::codec_id
}

struct DirectEndpoint {
  host @0 :Text;                # at most 255 bytes
  port @1 :UInt16;
}

struct TransferReport {
  bytes @0 :UInt64;
  path @1 :Text;                # at most 64 bytes
  fallbackReason @2 :Text;      # at most 1 KiB
}

struct Chunk {
  transferId @0 :UInt64;
  index @1 :UInt32;             # < count (when count > 0)
  count @2 :UInt32;
  totalBytes @3 :UInt64;        # at most 2^40
  bytes @4 :Data;               # at most 64 MiB
}

struct ChunkAck {
  transferId @0 :UInt64;
  index @1 :UInt32;
  done @2 :Bool;
  error @3 :Text;               # at most 1 KiB
}

struct TransferMessage {
  union {
    announce @0 :DirectAnnounce;
    endpoint @1 :DirectEndpoint;
    report @2 :TransferReport;
    chunk @3 :Chunk;
    chunkAck @4 :ChunkAck;
  }
}
