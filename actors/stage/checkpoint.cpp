#include "actors/stage/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/stage/state_parts.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

namespace starling::actors::stage {

namespace {

namespace fs = std::filesystem;

/// The first bytes of every checkpoint file (16 bytes).
constexpr char magic[] = "starling-ckpt-\n\0";
constexpr size_t magic_bytes = 16;
static_assert(sizeof(magic) == magic_bytes + 1);
/// Format version (bumped on any change of the header or payload). 2: the state carries the
/// model's buffers (protocol version 4's `stage.state`). 3: a lamb8 state carries its 8-bit
/// codes and scales (protocol version 5's `stage.state`).
constexpr uint64_t format_version = 3;
/// magic, version, stage, begin, end, steps, time, payload bytes, digest.
constexpr size_t header_bytes = magic_bytes + 7 * 8 + 32;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool valid_peer(const std::string& peer) {
  if (peer.empty() || peer.size() > 128)
    return false;
  return std::all_of(peer.begin(), peer.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

std::string errno_text() {
  return std::strerror(errno);
}

/// Writes all of `data` to `fd`.
status write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    auto n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return fail(errno_text());
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

/// Parses `stage<k>-l<b>-<e>-step<N>-t<ns>-<peer>.ckpt`; nothing for another name or key.
std::optional<checkpoint_file> parse_name(const std::string& name, const checkpoint_key& key) {
  auto prefix = fmt::format("stage{}-l{}-{}-step", key.stage, key.begin, key.end);
  const std::string suffix = ".ckpt";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  auto rest = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  auto digits = [](const std::string& s, size_t from, size_t to, uint64_t& out) {
    if (to <= from || to - from > 20)
      return false;
    out = 0;
    for (size_t i = from; i < to; ++i) {
      if (s[i] < '0' || s[i] > '9')
        return false;
      auto d = static_cast<uint64_t>(s[i] - '0');
      if (out > (UINT64_MAX - d) / 10)
        return false;
      out = out * 10 + d;
    }
    return true;
  };
  checkpoint_file f;
  auto dash = rest.find("-t");
  if (dash == std::string::npos || !digits(rest, 0, dash, f.steps))
    return std::nullopt;
  auto dash2 = rest.find('-', dash + 2);
  if (dash2 == std::string::npos || !digits(rest, dash + 2, dash2, f.time_ns))
    return std::nullopt;
  f.peer = rest.substr(dash2 + 1);
  if (!valid_peer(f.peer))
    return std::nullopt;
  return f;
}

bool newer(const checkpoint_file& a, const checkpoint_file& b) {
  if (a.steps != b.steps)
    return a.steps > b.steps;
  if (a.time_ns != b.time_ns)
    return a.time_ns > b.time_ns;
  return a.path > b.path;
}

} // namespace

std::string checkpoint_name(const checkpoint_key& key, uint64_t steps, uint64_t time_ns,
                            const std::string& peer) {
  return fmt::format("stage{}-l{}-{}-step{:09}-t{:020}-{}.ckpt", key.stage, key.begin, key.end,
                     steps, time_ns, peer);
}

result<checkpoint_written> write_checkpoint(const std::string& dir, const checkpoint_key& key,
                                            const std::string& peer, uint64_t time_ns,
                                            const messages::stage_state& s) {
  auto t0 = std::chrono::steady_clock::now();
  if (!valid_peer(peer))
    return fail(fmt::format("checkpoint: peer name '{}' is not usable in a file name", peer));
  if (!s.params.ok() || !s.params.tensor.defined())
    return fail("checkpoint: the state has no parameters");
  std::vector<char> payload;
  auto st = messages::encode_envelope(
      nullptr,
      [&](messages::payload_writer& w) {
        return messages::wire_codec<messages::stage_state>::write(w, s);
      },
      payload);
  if (!st)
    return fail(fmt::format("checkpoint: cannot encode the state: {}", st.what()));
  checkpoint_written out;
  out.digest = state_digest(s);
  std::string header(magic, magic_bytes);
  put_u64(header, format_version);
  put_u64(header, key.stage);
  put_u64(header, static_cast<uint64_t>(key.begin));
  put_u64(header, static_cast<uint64_t>(key.end));
  put_u64(header, s.steps);
  put_u64(header, time_ns);
  put_u64(header, payload.size());
  header += out.digest;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return fail(fmt::format("checkpoint: cannot create {}: {}", dir, ec.message()));
  auto name = checkpoint_name(key, s.steps, time_ns, peer);
  out.path = (fs::path{dir} / name).string();
  auto tmp = out.path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail(fmt::format("checkpoint: cannot create {}: {}", tmp, errno_text()));
  auto written = write_all(fd, header.data(), header.size());
  if (written)
    written = write_all(fd, payload.data(), payload.size());
  if (written && ::fsync(fd) != 0)
    written = fail(errno_text());
  if (::close(fd) != 0 && written)
    written = fail(errno_text());
  if (!written) {
    ::unlink(tmp.c_str());
    return fail(fmt::format("checkpoint: cannot write {}: {}", tmp, written.what()));
  }
  if (::rename(tmp.c_str(), out.path.c_str()) != 0) {
    auto why = errno_text();
    ::unlink(tmp.c_str());
    return fail(fmt::format("checkpoint: cannot rename {} to {}: {}", tmp, out.path, why));
  }
  // The rename is durable once the directory is synced.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  out.bytes = header.size() + payload.size();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

result<checkpoint_loaded> read_checkpoint(const std::string& path, const checkpoint_key& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(fmt::format("cannot open: {}", errno_text()));
  std::string head(header_bytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  auto got = static_cast<size_t>(in.gcount());
  if (got < magic_bytes || std::memcmp(head.data(), magic, magic_bytes) != 0)
    return fail("not a starling checkpoint (bad magic)");
  if (got < header_bytes)
    return fail(fmt::format("truncated: {} bytes, the header alone has {}", got, header_bytes));
  const char* p = head.data() + magic_bytes;
  auto version = get_u64(p);
  if (version != format_version)
    return fail(fmt::format("checkpoint format version {} (another starling build), this build "
                            "reads format version {}",
                            version, format_version));
  checkpoint_loaded out;
  auto stage = get_u64(p + 8);
  auto begin = static_cast<int64_t>(get_u64(p + 16));
  auto end = static_cast<int64_t>(get_u64(p + 24));
  if (stage != key.stage || begin != key.begin || end != key.end)
    return fail(fmt::format("holds stage {} layers [{}, {}), expected stage {} layers [{}, {})",
                            stage, begin, end, key.stage, key.begin, key.end));
  out.file.path = path;
  out.file.steps = get_u64(p + 32);
  out.file.time_ns = get_u64(p + 40);
  auto payload_bytes = get_u64(p + 48);
  out.digest.assign(p + 56, 32);
  if (payload_bytes == 0 || payload_bytes > messages::max_message_bytes)
    return fail(fmt::format("a payload of {} bytes is out of range", payload_bytes));
  std::vector<char> payload(static_cast<size_t>(payload_bytes));
  in.read(payload.data(), static_cast<std::streamsize>(payload.size()));
  auto read = static_cast<uint64_t>(in.gcount());
  if (read != payload_bytes)
    return fail(fmt::format("truncated: {} of {} payload bytes", read, payload_bytes));
  if (in.peek() != std::char_traits<char>::eof())
    return fail("trailing bytes after the payload");
  auto refusal = messages::decode_envelope(
      payload.data(), payload.size(), nullptr, messages::wire_codec<messages::stage_state>::name,
      [](const messages::payload_reader& r) {
        return messages::wire_codec<messages::stage_state>::matches(r);
      },
      [&](const messages::payload_reader& r) {
        return messages::wire_codec<messages::stage_state>::read(r, out.state);
      });
  if (refusal)
    return fail(fmt::format("the state does not decode: {}", refusal->line()));
  if (!out.state.params.ok() || !out.state.params.tensor.defined())
    return fail("the state has no parameters");
  if (!out.state.moments.ok())
    return fail(fmt::format("the optimizer moments do not decode: {}", out.state.moments.error));
  if (out.state.steps != out.file.steps)
    return fail(
        fmt::format("the header says step {}, the state {}", out.file.steps, out.state.steps));
  if (state_digest(out.state) != out.digest)
    return fail(fmt::format("digest mismatch: the header says {}, the bytes hash to {}",
                            digest_hex(out.digest), digest_hex(state_digest(out.state))));
  auto name = fs::path{path}.filename().string();
  if (auto parsed = parse_name(name, key))
    out.file.peer = parsed->peer;
  out.state.samples = 0;
  return out;
}

std::vector<checkpoint_file> list_checkpoints(const std::string& dir, const checkpoint_key& key) {
  std::vector<checkpoint_file> out;
  std::error_code ec;
  fs::directory_iterator it{dir, ec};
  if (ec)
    return out;
  for (; it != fs::directory_iterator{}; it.increment(ec)) {
    if (ec)
      break;
    if (!it->is_regular_file(ec))
      continue;
    auto parsed = parse_name(it->path().filename().string(), key);
    if (!parsed)
      continue;
    parsed->path = it->path().string();
    out.push_back(std::move(*parsed));
  }
  std::sort(out.begin(), out.end(), newer);
  return out;
}

checkpoint_search newest_checkpoint(const std::vector<std::string>& dirs, const checkpoint_key& key,
                                    const std::function<status(const checkpoint_loaded&)>& accept) {
  std::vector<checkpoint_file> all;
  for (auto& d : dirs) {
    auto found = list_checkpoints(d, key);
    all.insert(all.end(), found.begin(), found.end());
  }
  std::sort(all.begin(), all.end(), newer);
  checkpoint_search out;
  for (auto& f : all) {
    auto r = read_checkpoint(f.path, key);
    if (!r) {
      out.rejected.push_back(fmt::format("{}: {}", f.path, r.error().what));
      continue;
    }
    if (accept) {
      if (auto st = accept(*r); !st) {
        out.rejected.push_back(fmt::format("{}: not usable: {}", f.path, st.what()));
        continue;
      }
    }
    out.found = std::move(*r);
    break;
  }
  return out;
}

size_t prune_checkpoints(const std::string& dir, const checkpoint_key& key, const std::string& peer,
                         size_t keep) {
  keep = std::max<size_t>(keep, 1);
  size_t kept = 0;
  size_t removed = 0;
  for (auto& f : list_checkpoints(dir, key)) {
    if (f.peer != peer)
      continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    std::error_code ec;
    if (fs::remove(f.path, ec))
      ++removed;
  }
  return removed;
}

std::string pending_dir(const std::string& checkpoint_dir) {
  return checkpoint_dir + "/pending";
}

result<checkpoint_written> write_pending_gradient(const std::string& checkpoint_dir,
                                                  const checkpoint_key& key,
                                                  const std::string& slot, uint64_t time_ns,
                                                  const pending_gradient& g) {
  if (!g.sum.defined() || g.sum.numel() == 0)
    return fail("pending gradient: nothing accumulated");
  messages::stage_state s;
  s.steps = g.step;
  s.params.tensor = g.sum.to(at::kFloat).contiguous().reshape({-1});
  s.params.codec = kernels::codec_id::none;
  s.optimizer_steps = {g.samples, g.microbatches};
  auto dir = pending_dir(checkpoint_dir);
  auto w = write_checkpoint(dir, key, slot, time_ns, s);
  if (w)
    prune_checkpoints(dir, key, slot, 1);
  return w;
}

pending_taken take_pending_gradient(const std::vector<std::string>& dirs,
                                    const checkpoint_key& key, const std::string& slot,
                                    uint64_t step) {
  pending_taken out;
  std::vector<checkpoint_file> mine;
  for (auto& d : dirs)
    for (auto& f : list_checkpoints(pending_dir(d), key))
      if (f.peer == slot)
        mine.push_back(std::move(f));
  std::sort(mine.begin(), mine.end(), newer);
  for (auto& f : mine) {
    if (!out.gradient) {
      auto r = read_checkpoint(f.path, key);
      if (!r) {
        out.notes.push_back(fmt::format("{}: rejected: {}", f.path, r.error().what));
      } else if (r->state.optimizer_steps.size() != 2) {
        out.notes.push_back(fmt::format("{}: rejected: not a pending gradient", f.path));
      } else if (r->state.steps != step) {
        out.notes.push_back(fmt::format("{}: stale: saved at step {}, the state is at step {}",
                                        f.path, r->state.steps, step));
      } else {
        pending_gradient g;
        g.step = step;
        g.samples = r->state.optimizer_steps[0];
        g.microbatches = r->state.optimizer_steps[1];
        g.sum = r->state.params.tensor.to(at::kFloat).reshape({-1});
        out.gradient = std::move(g);
        out.notes.push_back(fmt::format("{}: taken up ({} samples)", f.path,
                                        out.gradient->samples));
      }
    }
    std::error_code ec;
    fs::remove(f.path, ec);
  }
  return out;
}

std::string digest_hex(const std::string& digest) {
  std::string out;
  out.reserve(digest.size() * 2);
  for (unsigned char c : digest)
    out += fmt::format("{:02x}", c);
  return out;
}

} // namespace starling::actors::stage
