# The averager protocol (messages/averager.hpp): requests and results, matchmaking and the
# butterfly all-reduce's chunks. A tensor that may be absent is a pointer left unset.
@0xdfcc1948e4e5fc3e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

using import "tensor.capnp".Tensor;

struct TensorSlot {
  tensor @0 :Tensor;            # unset: an undefined tensor
}

struct MemberInfo {
  address @0 :Text;             # at most 512 bytes
  bandwidth @1 :Float64;        # finite, >= 0
  auxiliary @2 :Bool;
}

struct PartSegment {
  offset @0 :Int64;             # >= 0
  size @1 :Int64;               # >= 0
  contributors @2 :List(UInt32);
}

struct PartReport {
  reducer @0 :UInt32;
  offset @1 :Int64;
  size @2 :Int64;
  contributors @3 :List(UInt32);
  status @4 :UInt8;             # 0 averaged, 1 own_value_kept, 2 failed
  reason @5 :Text;
  segments @6 :List(PartSegment);
}

struct RoundReport {
  groupKey @0 :Text;
  groupId @1 :UInt64;
  members @2 :List(MemberInfo);
  self @3 :UInt32;              # < members (when there are members)
  parts @4 :List(PartReport);
  outcome @5 :UInt8;            # 0 complete, 1 partial, 2 no_partner, 3 error
  averaged @6 :UInt32;
  kept @7 :UInt32;
  failed @8 :UInt32;
  detail @9 :Text;
  elapsedNs @10 :Int64;
  roundNs @11 :Int64;
  planeLinks @12 :UInt32;
  topkBytesSent @13 :UInt64;
  topkBytesReceived @14 :UInt64;
  received @15 :List(Float64);  # per member (<= members), -1 or a finite weight >= 0
}

struct TensorList {
  tensors @0 :List(TensorSlot);
}

struct AverageResult {
  tensors @0 :List(TensorSlot);
  report @1 :RoundReport;
}

struct AvgJoin {
  groupKey @0 :Text;
  member @1 :MemberInfo;
  numel @2 :Int64;              # 0 .. 2^40
}

struct AvgJoinReply {
  verdict @0 :UInt8;            # 0 accepted, 1 redirected, 2 refused
  redirect @1 :Text;
  reason @2 :Text;
}

struct AvgLeave {
  groupKey @0 :Text;
  address @1 :Text;
  leader @2 :Text;
}

struct AvgGroup {
  groupKey @0 :Text;
  groupId @1 :UInt64;
  members @2 :List(MemberInfo);
  numel @3 :Int64;
}

struct AvgChunk {
  groupId @0 :UInt64;
  kind @1 :UInt8;               # 0 contribution, 1 result
  part @2 :UInt32;
  from @3 :UInt32;
  weight @4 :Float64;           # finite
  offset @5 :Int64;             # >= 0
  values @6 :Tensor;            # unset: no values
  encoded @7 :Data;             # a compressed chunk's Cap'n Proto Tensor
  contributors @8 :List(UInt32);
  error @9 :Text;
}

struct AvgAck {
  groupId @0 :UInt64;
  kind @1 :UInt8;
  part @2 :UInt32;
  from @3 :UInt32;
}

struct AveragerMessage {
  union {
    join @0 :AvgJoin;
    joinReply @1 :AvgJoinReply;
    leave @2 :AvgLeave;
    group @3 :AvgGroup;
    chunk @4 :AvgChunk;
    ack @5 :AvgAck;
    tensorList @6 :TensorList;
    averageResult @7 :AverageResult;
    memberInfo @8 :MemberInfo;
    partSegment @9 :PartSegment;
    partReport @10 :PartReport;
    roundReport @11 :RoundReport;
  }
}
