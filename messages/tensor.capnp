# A tensor on the wire: the header a decoder validates, then the codec's payload in chunks.
# The payload layout of each codec is documented in kernels/compress/format.hpp; its exact size
# is a function of (shape, codec, params), so a decoder checks it before reading anything.
@0x95f1ed797fb0682e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("starling::wire");

# Parameters of a codec, as resolved by the encoder (k and indexBits are never "auto" here).
# Fields a codec does not use are carried but ignored.
struct CodecParams {
  ratio @0 :Float64;       # topk/randk: fraction kept (informational once k is resolved)
  k @1 :UInt64;            # topk/randk: number of coordinates in the payload, <= numel
  seed @2 :UInt64;         # randk: shared seed choosing the coordinates; quantile8: sample seed
  blockSize @3 :UInt32;    # blockwise8: elements per block, >= 1
  sampleSize @4 :UInt32;   # quantile8: sample size used to estimate quantiles, >= 1
  indexBits @5 :UInt8;     # topk: 32 or 64, the width of each index in the payload
  chunkBytes @6 :UInt64;   # largest chunk in `Tensor.chunks`, 1 .. 64 MiB
}

struct Tensor {
  dtype @0 :UInt8;
  # The original element type, restored on decode (kernels::wire_dtype): 0 float32, 1 float16,
  # 2 bfloat16, 3 float64, 4 uint8, 5 int8, 6 int16, 7 int32, 8 int64, 9 bool. A plain integer,
  # not an enum, so that an unknown value reaches validation and is rejected with its number.

  shape @1 :List(Int64);
  # Dimensions, outermost first; empty for a 0-d tensor. Each >= 0, product <= 2^40.

  codec @2 :UInt8;
  # The payload's encoding (kernels::codec_id): 0 none, 1 fp16, 2 bf16, 3 uniform8,
  # 4 blockwise8, 5 quantile8, 6 topk, 7 randk.

  params @3 :CodecParams;
  # The codec's resolved parameters.

  chunks @4 :List(Data);
  # The payload split in order into pieces of at most params.chunkBytes (<= 64 MiB) each, far
  # below Cap'n Proto's 2^29-byte limit on one Data blob. Empty for an empty payload.
}
