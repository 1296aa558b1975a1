# The MASHA / extragradient protocol (messages/vi.hpp): compressed flat vectors between workers
# and the server.
@0xedfac27e8ed794a9;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

struct ViVector {
  codec @0 :UInt8;              # 0 dense, 1 rand-k, 2 top-k
  dim @1 :UInt32;               # at most 2^28
  seed @2 :UInt64;              # rand-k: the indices' seed
  indices @3 :List(UInt32);     # top-k: one per value, each < dim
  values @4 :List(Float32);     # at most dim
}

struct ViUplink {
  worker @0 :UInt32;
  round @1 :UInt64;
  phase @2 :UInt8;              # 0 full, 1 compressed, 2 eg_point, 3 eg_half
  payload @3 :ViVector;
}

struct ViDownlink {
  round @0 :UInt64;
  phase @1 :UInt8;
  coin @2 :Bool;
  payload @3 :ViVector;
}

struct ViReport {
  iterations @0 :UInt64;
  z @1 :List(Float64);          # at most 2^28
  bitsUp @2 :UInt64;
  bitsDown @3 :UInt64;
  liveWorkers @4 :UInt32;
}

struct ViMessage {
  union {
    vector @0 :ViVector;
    uplink @1 :ViUplink;
    downlink @2 :ViDownlink;
    report @3 :ViReport;
  }
}
