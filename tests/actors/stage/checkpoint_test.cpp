// Stage checkpoints on disk (actors/stage/checkpoint.hpp): atomic files verified by digest, newest
// first, corrupt ones rejected with their reason.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "actors/stage/checkpoint.hpp"
#include "actors/stage/state_parts.hpp"
#include "kernels/optim/lamb8.hpp"
#include "kernels/optim/optimizer.hpp"
#include "support/node_fixtures.hpp"

namespace starling::test::actors_checkpoint_test {

using namespace starling;
using namespace starling::actors::stage;

namespace {

/// A state of `n` parameters with Adam-like moments, as a stage peer's snapshot looks.
messages::stage_state make_state(uint64_t steps, int64_t n = 1000, uint64_t seed = 1) {
  torch::manual_seed(seed);
  messages::stage_state s;
  s.params.tensor = torch::randn({n});
  s.params.codec = kernels::codec_id::none;
  s.moments.tensor = torch::rand({2 * n});
  s.moments.codec = kernels::codec_id::none;
  s.optimizer_steps = {steps, steps};
  s.steps = steps;
  s.samples = 123;
  return s;
}

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

} // namespace

TEST_CASE("a stage checkpoint reads back bit for bit with the digest of the state it holds") {
  testing::temp_dir dir{"starling-ckpt"};
  checkpoint_key key{2, 2, 3};
  auto s = make_state(7);
  auto w = write_checkpoint(dir.path + "/sub", key, "s2p6g0", 1000, s);
  REQUIRE(w.ok());
  CHECK(w->bytes == std::filesystem::file_size(w->path));
  CHECK(w->bytes > 3000 * 4); // parameters and moments, uncompressed
  CHECK(w->digest == state_digest(s));
  // No temporary file is left behind.
  CHECK(!std::filesystem::exists(w->path + ".tmp"));
  auto r = read_checkpoint(w->path, key);
  REQUIRE(r.ok());
  CHECK(r->digest == w->digest);
  CHECK(state_digest(r->state) == w->digest);
  CHECK(r->state.steps == 7);
  CHECK(r->state.samples == 0);
  CHECK(r->state.optimizer_steps == s.optimizer_steps);
  CHECK(torch::equal(r->state.params.tensor, s.params.tensor));
  CHECK(torch::equal(r->state.moments.tensor, s.moments.tensor));
  CHECK(r->file.peer == "s2p6g0");
  // Another stage's or layer range's reader refuses it.
  auto other = read_checkpoint(w->path, checkpoint_key{2, 1, 3});
  REQUIRE(!other.ok());
  CHECK(other.error().what.find("expected stage 2 layers [1, 3)") != std::string::npos);
  // A peer name that is not a file name is refused before anything is written.
  CHECK(!write_checkpoint(dir.path, key, "../x", 1, s).ok());
}

TEST_CASE("the newest checkpoint that verifies is found: a truncated one and a corrupt one are "
          "rejected with their reasons") {
  testing::temp_dir a{"starling-ckpt"};
  testing::temp_dir b{"starling-ckpt"};
  checkpoint_key key{1, 0, 2};
  auto s5 = make_state(5, 500, 5);
  auto s6 = make_state(6, 500, 6);
  auto s7 = make_state(7, 500, 7);
  auto w5 = write_checkpoint(a.path, key, "p0", 50, s5);
  auto w6 = write_checkpoint(b.path, key, "p1", 60, s6);
  auto w7 = write_checkpoint(a.path, key, "p0", 70, s7);
  REQUIRE((w5.ok() && w6.ok() && w7.ok()));
  // Another stage's checkpoint in the same folder is not listed.
  REQUIRE(write_checkpoint(a.path, checkpoint_key{0, 0, 1}, "p0", 80, make_state(9, 10)).ok());
  auto listed = list_checkpoints(a.path, key);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].steps == 7);
  CHECK(listed[1].steps == 5);
  // All intact: the newest over both folders.
  auto all = newest_checkpoint({a.path, b.path}, key);
  REQUIRE(all.found);
  CHECK(all.found->state.steps == 7);
  CHECK(all.rejected.empty());
  // Step 7 truncated (a crash mid-copy), step 6 with one flipped payload byte.
  std::filesystem::resize_file(w7->path, w7->bytes - 100);
  flip_byte(w6->path, static_cast<std::streamoff>(w6->bytes - 64));
  auto found = newest_checkpoint({a.path, b.path}, key);
  REQUIRE(found.found);
  CHECK(found.found->state.steps == 5);
  CHECK(found.found->digest == w5->digest);
  REQUIRE(found.rejected.size() == 2);
  CHECK(found.rejected[0].find("truncated") != std::string::npos);
  CHECK(found.rejected[1].find("digest mismatch") != std::string::npos);
  // A state the caller cannot take (another shape) is skipped too.
  auto picky = newest_checkpoint({a.path}, key, [](const checkpoint_loaded& c) -> status {
    if (c.state.steps == 5)
      return fail("wrong shape");
    return {};
  });
  CHECK(!picky.found);
  CHECK(picky.rejected.size() == 2);
  // A file that is not a checkpoint at all.
  std::ofstream{a.path + "/" + checkpoint_name(key, 99, 1, "p9")} << "hello";
  auto junk = newest_checkpoint({a.path}, key);
  REQUIRE(junk.found);
  CHECK(junk.found->state.steps == 5);
  CHECK(junk.rejected.front().find("bad magic") != std::string::npos);
}

TEST_CASE("a checkpoint holds the model's buffers, and one of the previous format is refused in one "
          "line naming both versions") {
  testing::temp_dir dir{"starling-ckpt"};
  checkpoint_key key{0, 0, 1};
  auto s = make_state(4, 100);
  s.buffers.tensor = torch::rand({6});
  s.int_buffers.tensor = torch::tensor({int64_t{4}, int64_t{4}});
  auto w = write_checkpoint(dir.path, key, "p0", 10, s);
  REQUIRE(w.ok());
  auto r = read_checkpoint(w->path, key);
  REQUIRE(r.ok());
  CHECK(torch::equal(r->state.buffers.tensor, s.buffers.tensor));
  CHECK(torch::equal(r->state.int_buffers.tensor, s.int_buffers.tensor));
  // The digest covers the buffers.
  auto no_buffers = s;
  no_buffers.buffers = {};
  no_buffers.int_buffers = {};
  CHECK(state_digest(no_buffers) != w->digest);
  // The same file as the previous build wrote it: format version 2 in the header, after the
  // 16-byte magic (little-endian).
  {
    std::fstream f(w->path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    f.put(2);
  }
  auto old = read_checkpoint(w->path, key);
  REQUIRE_FALSE(old.ok());
  CHECK(old.error().what.find("checkpoint format version 2 (another starling build), this build "
                              "reads format version 3")
        != std::string::npos);
  CHECK(old.error().what.find('\n') == std::string::npos);
}

TEST_CASE("a lamb8 checkpoint holds its codes and scales, and the state continues from it") {
  testing::temp_dir dir{"starling-ckpt"};
  checkpoint_key key{0, 0, 1};
  torch::manual_seed(3);
  std::vector<torch::Tensor> params{torch::randn({100, 100}).requires_grad_(true),
                                    torch::randn({50}).requires_grad_(true)};
  kernels::lamb8 opt(params);
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    (params[0].pow(3).sum() + params[1].sum()).backward();
    opt.step();
  }
  auto m = kernels::save_optimizer_moments(opt, kernels::moments_form::compact).value();
  messages::stage_state s;
  s.params.tensor = torch::cat({params[0].detach().reshape({-1}), params[1].detach()});
  s.params.codec = kernels::codec_id::none;
  s.packed_moments = m.packed;
  s.optimizer_steps = m.steps;
  s.steps = 2;
  auto w = write_checkpoint(dir.path, key, "p", 1000, s);
  REQUIRE(w.ok());
  // Parameters in fp32, moments in about two bytes per element (not eight).
  CHECK(w->bytes < 10050 * 4 + 10000 * 2 + 2000);
  auto r = read_checkpoint(w->path, key);
  REQUIRE(r.ok());
  CHECK(r->state.packed_moments == m.packed);
  CHECK_FALSE(r->state.moments.tensor.defined());
  std::vector<torch::Tensor> other{torch::zeros({100, 100}), torch::zeros({50})};
  kernels::lamb8 resumed(other);
  REQUIRE(kernels::load_optimizer_moments(
            resumed, {r->state.moments.tensor, r->state.optimizer_steps, r->state.packed_moments})
            .ok());
  CHECK(resumed.save_state() == opt.save_state());
}

TEST_CASE("a peer keeps only its own newest checkpoints") {
  testing::temp_dir dir{"starling-ckpt"};
  checkpoint_key key{0, 0, 1};
  for (uint64_t st = 1; st <= 4; ++st) {
    REQUIRE(write_checkpoint(dir.path, key, "me", st, make_state(st, 10)).ok());
    REQUIRE(write_checkpoint(dir.path, key, "other", st, make_state(st, 10)).ok());
  }
  CHECK(prune_checkpoints(dir.path, key, "me", 2) == 2);
  auto left = list_checkpoints(dir.path, key);
  REQUIRE(left.size() == 6);
  size_t mine = 0;
  for (auto& f : left)
    if (f.peer == "me") {
      ++mine;
      CHECK(f.steps >= 3);
    }
  CHECK(mine == 2);
}

} // namespace starling::test::actors_checkpoint_test
