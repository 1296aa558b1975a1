#include "kernels/data/token_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace starling::kernels {

namespace {

/// Closes a descriptor when the scope ends (the mapping outlives it).
struct fd_closer {
  int fd;
  ~fd_closer() {
    if (fd >= 0)
      ::close(fd);
  }
};

uint32_t load_le(const unsigned char* p, std::size_t width) {
  // Byte by byte: the same on any host; compilers turn it into one load on little-endian ones.
  if (width == 2)
    return uint32_t{p[0]} | (uint32_t{p[1]} << 8);
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

} // namespace

const char* to_string(token_dtype dtype) noexcept {
  return dtype == token_dtype::uint16 ? "uint16" : "uint32";
}

result<token_dtype> parse_token_dtype(std::string_view name) {
  if (name == "uint16")
    return token_dtype::uint16;
  if (name == "uint32")
    return token_dtype::uint32;
  return fail(fmt::format("token dtype `{}`, expected uint16 or uint32", name));
}

token_file::token_file(token_file_options opts, const unsigned char* data, std::size_t bytes)
    : opts_(std::move(opts)),
      data_(data),
      bytes_(bytes),
      tokens_(bytes / token_width(opts_.dtype)) {}

token_file::token_file(token_file&& other) noexcept
    : opts_(std::move(other.opts_)),
      data_(other.data_),
      bytes_(other.bytes_),
      tokens_(other.tokens_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.tokens_ = 0;
}

token_file& token_file::operator=(token_file&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr)
      ::munmap(const_cast<unsigned char*>(data_), bytes_);
    opts_ = std::move(other.opts_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    tokens_ = other.tokens_;
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.tokens_ = 0;
  }
  return *this;
}

token_file::~token_file() {
  if (data_ != nullptr)
    ::munmap(const_cast<unsigned char*>(data_), bytes_);
}

result<token_file> token_file::open(const token_file_options& opts) {
  if (opts.path.empty())
    return fail("token file: no path given");
  if (opts.dtype != token_dtype::uint16 && opts.dtype != token_dtype::uint32)
    return fail(fmt::format("token file {}: token width {}, expected 2 (uint16) or 4 (uint32)",
                            opts.path, static_cast<int>(opts.dtype)));
  if (opts.vocab_size == 0)
    return fail(fmt::format("token file {}: vocab_size is 0, expected the model's vocabulary "
                            "size",
                            opts.path));
  struct stat st {};
  if (::stat(opts.path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return fail(fmt::format("token file {}: not found", opts.path));
    return fail(fmt::format("token file {}: cannot stat: {}", opts.path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode))
    return fail(fmt::format("token file {}: not a regular file", opts.path));
  const auto bytes = static_cast<std::size_t>(st.st_size);
  const std::size_t width = token_width(opts.dtype);
  if (bytes == 0)
    return fail(fmt::format("token file {}: empty (0 bytes), expected {} tokens", opts.path,
                            to_string(opts.dtype)));
  if (bytes % width != 0)
    return fail(fmt::format("token file {}: {} bytes is not a multiple of the token width {} "
                            "({}): truncated, or not a {} token file",
                            opts.path, bytes, width, to_string(opts.dtype), to_string(opts.dtype)));
  fd_closer fd{::open(opts.path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0)
    return fail(fmt::format("token file {}: cannot open: {}", opts.path, std::strerror(errno)));
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED)
    return fail(fmt::format("token file {}: cannot map {} bytes: {}", opts.path, bytes,
                            std::strerror(errno)));
  token_file f(opts, static_cast<const unsigned char*>(map), bytes);
  if (opts.validate_at_open) {
    ::madvise(map, bytes, MADV_SEQUENTIAL);
    for (uint64_t i = 0; i < f.tokens_; ++i)
      if (auto id = f.at(i); id >= opts.vocab_size)
        return f.out_of_vocabulary(i, id);
    ::madvise(map, bytes, MADV_RANDOM); // training reads windows in shuffled order
  }
  return f;
}

uint32_t token_file::at(uint64_t i) const noexcept {
  const std::size_t width = token_width(opts_.dtype);
  return load_le(data_ + i * width, width);
}

failure token_file::out_of_vocabulary(uint64_t i, uint32_t id) const {
  return fail(fmt::format("token file {}: token {} (byte offset {}) is {}, expected an id below "
                          "the vocabulary size {}",
                          opts_.path, i, i * token_width(opts_.dtype), id, opts_.vocab_size));
}

status token_file::read(uint64_t first, uint64_t count, int64_t* out) const {
  if (first > tokens_ || count > tokens_ - first)
    return fail(fmt::format("token file {}: tokens [{}, {}) requested, the file has {}", opts_.path,
                            first, first + count, tokens_));
  for (uint64_t k = 0; k < count; ++k) {
    const uint32_t id = at(first + k);
    if (!opts_.validate_at_open && id >= opts_.vocab_size)
      return out_of_vocabulary(first + k, id);
    out[k] = id;
  }
  return {};
}

status write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                        token_dtype dtype) {
  const std::size_t width = token_width(dtype);
  std::string bytes;
  bytes.reserve(tokens.size() * width);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    if (dtype == token_dtype::uint16 && t > 0xffff)
      return fail(fmt::format("token {} at index {} does not fit uint16", t, i));
    for (std::size_t b = 0; b < width; ++b)
      bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out)
    return fail(fmt::format("token file {}: cannot write", path));
  return {};
}

} // namespace starling::kernels
