// The averager's chunk meta encoding (pure): round trips, and malformed bytes are refused.
#include "actors/averager/chunk.hpp"

#include <doctest/doctest.h>

#include <cmath>

namespace starling::test::actors_chunk_test {

using namespace starling::actors::averager;

namespace {

chunk_meta sample_meta() {
  chunk_meta m;
  m.group_id = 0x1234567890abcdefULL;
  m.kind = result_chunk;
  m.part = 3;
  m.from = 2;
  m.weight = 0.25;
  m.offset = 1 << 20;
  m.contributors = {0, 2, 5};
  return m;
}

} // namespace

TEST_CASE("chunk meta round trips, truncated, padded and out-of-range metas are refused") {
  auto m = sample_meta();
  m.error = "reducer failed";
  auto bytes = encode_chunk_meta(m);
  REQUIRE(bytes);
  auto d = decode_chunk_meta(bytes->data(), bytes->size());
  REQUIRE(d);
  CHECK(d->group_id == m.group_id);
  CHECK(d->kind == result_chunk);
  CHECK(d->part == 3);
  CHECK(d->from == 2);
  CHECK(d->weight == 0.25);
  CHECK(d->offset == m.offset);
  CHECK(d->contributors == m.contributors);
  CHECK(d->error == "reducer failed");
  // Every truncation and one byte too many are refused.
  for (size_t n = 0; n < bytes->size(); ++n)
    CHECK_FALSE(decode_chunk_meta(bytes->data(), n));
  auto longer = *bytes;
  longer.push_back(0);
  CHECK_FALSE(decode_chunk_meta(longer.data(), longer.size()));
  // Field checks: kind, weight, offset, contributor count.
  auto bad = [&](auto edit) {
    auto x = sample_meta();
    edit(x);
    auto b = encode_chunk_meta(x);
    REQUIRE(b);
    return !decode_chunk_meta(b->data(), b->size());
  };
  CHECK(bad([](chunk_meta& x) { x.kind = 2; }));
  CHECK(bad([](chunk_meta& x) { x.weight = -1; }));
  CHECK(bad([](chunk_meta& x) { x.weight = std::nan(""); }));
  CHECK(bad([](chunk_meta& x) { x.weight = INFINITY; }));
  CHECK(bad([](chunk_meta& x) { x.offset = -5; }));
  auto huge = *encode_chunk_meta(sample_meta());
  huge[33] = 0xff; // contributor count far beyond the bytes
  CHECK_FALSE(decode_chunk_meta(huge.data(), huge.size()));
  chunk_meta many;
  many.contributors.assign(chunk_max_contributors + 1, 0);
  CHECK_FALSE(encode_chunk_meta(many));
  chunk_meta wordy;
  wordy.error.assign(chunk_max_error_bytes + 1, 'x');
  CHECK_FALSE(encode_chunk_meta(wordy));
}

} // namespace starling::test::actors_chunk_test
