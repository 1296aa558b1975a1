#include "actors/auth/identity.hpp"

#include <sodium.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace starling::actors::auth {

namespace {

const char* header_of(key_role role, bool secret) {
  if (role == key_role::node)
    return secret ? "starling-node-secret-key-v1\n" : "starling-node-public-key-v1\n";
  return secret ? "starling-authority-secret-key-v1\n" : "starling-authority-public-key-v1\n";
}

const char* role_name(key_role role) {
  return role == key_role::node ? "node" : "authority";
}

void init_sodium() {
  // Idempotent and thread-safe; returns 1 when already done, -1 only if the OS has no randomness.
  if (sodium_init() < 0)
    std::abort();
}

std::string errno_text() {
  return std::strerror(errno);
}

/// Reads at most `max_bytes + 1` bytes from `fd` (one more reveals a file that is too large).
result<std::string> read_fd(int fd, size_t max_bytes, const std::string& path) {
  std::string out;
  out.resize(max_bytes + 1);
  size_t got = 0;
  while (got < out.size()) {
    auto n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return fail(path + ": cannot read: " + errno_text());
    }
    if (n == 0)
      break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

status write_all(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return fail(path + ": cannot write: " + errno_text());
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

status make_parent(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (parent.empty())
    return {};
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec)
    return fail(parent.string() + ": cannot create the folder: " + ec.message());
  return {};
}

} // namespace

key_pair key_pair::from_seed(const std::array<uint8_t, seed_bytes>& seed) {
  init_sodium();
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_seed_keypair(pk, sk, seed.data());
  key_pair out{std::string(reinterpret_cast<char*>(pk), sizeof(pk)),
               std::string(reinterpret_cast<char*>(sk), sizeof(sk))};
  sodium_memzero(sk, sizeof(sk));
  return out;
}

key_pair key_pair::from_test_seed(uint64_t seed) {
  init_sodium();
  std::array<uint8_t, seed_bytes> s{};
  unsigned char in[8];
  for (int i = 0; i < 8; ++i)
    in[i] = static_cast<unsigned char>((seed >> (8 * i)) & 0xff);
  crypto_generichash(s.data(), s.size(), in, sizeof(in), nullptr, 0);
  return from_seed(s);
}

key_pair key_pair::generate() {
  init_sodium();
  std::array<uint8_t, seed_bytes> s{};
  randombytes_buf(s.data(), s.size());
  auto out = from_seed(s);
  sodium_memzero(s.data(), s.size());
  return out;
}

std::string key_pair::peer_id() const {
  return peer_id_of(public_key_);
}

std::string key_pair::sign(std::string_view message) const {
  unsigned char sig[crypto_sign_BYTES];
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                       message.size(), reinterpret_cast<const unsigned char*>(secret_key_.data()));
  return std::string(reinterpret_cast<char*>(sig), sizeof(sig));
}

bool verify_signature(std::string_view public_key, std::string_view message,
                      std::string_view signature) {
  if (public_key.size() != crypto_sign_PUBLICKEYBYTES || signature.size() != crypto_sign_BYTES)
    return false;
  init_sodium();
  return crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(signature.data()),
                                     reinterpret_cast<const unsigned char*>(message.data()),
                                     message.size(),
                                     reinterpret_cast<const unsigned char*>(public_key.data()))
         == 0;
}

std::string peer_id_of(std::string_view public_key) {
  unsigned char out[peer_id_bytes];
  crypto_generichash(out, sizeof(out), reinterpret_cast<const unsigned char*>(public_key.data()),
                     public_key.size(), nullptr, 0);
  return std::string(reinterpret_cast<char*>(out), sizeof(out));
}

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  return s;
}

result<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0)
    return fail("hex of odd length " + std::to_string(hex.size()));
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    auto hi = nibble(hex[i]);
    auto lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return fail("not a hex digit at position " + std::to_string(hi < 0 ? i : i + 1));
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

std::string format_secret_key(const key_pair& key, key_role role) {
  return header_of(role, true) + to_hex(key.seed()) + "\n" + to_hex(key.public_key()) + "\n";
}

size_t secret_key_file_bytes(key_role role) {
  return std::strlen(header_of(role, true)) + 2 * (2 * seed_bytes + 1);
}

result<key_pair> parse_secret_key(std::string_view text, key_role role, const std::string& what) {
  std::string_view header = header_of(role, true);
  auto expected = secret_key_file_bytes(role);
  auto other = role == key_role::node ? key_role::authority : key_role::node;
  if (text.substr(0, std::strlen(header_of(role, false))) == header_of(role, false))
    return fail(what + ": this is a public key file; expected a " + role_name(role)
                + " secret key file");
  if (text.substr(0, std::strlen(header_of(other, true))) == header_of(other, true))
    return fail(what + ": this is the " + std::string{role_name(other)}
                + " secret key file; expected the " + role_name(role) + "'s");
  if (text.size() != expected)
    return fail(what + ": a " + std::string{role_name(role)} + " secret key file is "
                + std::to_string(expected) + " bytes, this one is " + std::to_string(text.size()));
  if (text.substr(0, header.size()) != header)
    return fail(what + ": expected a first line '" + std::string{header.substr(0, header.size() - 1)}
                + "'");
  auto body = text.substr(header.size());
  auto seed_hex = body.substr(0, 2 * seed_bytes);
  auto pk_hex = body.substr(2 * seed_bytes + 1, 2 * public_key_bytes);
  if (body[2 * seed_bytes] != '\n' || body.back() != '\n')
    return fail(what + ": expected the seed and the public key in hex, one per line");
  auto seed = from_hex(seed_hex);
  if (!seed)
    return fail(what + ": seed: " + seed.error().what);
  auto pk = from_hex(pk_hex);
  if (!pk)
    return fail(what + ": public key: " + pk.error().what);
  std::array<uint8_t, seed_bytes> s{};
  std::memcpy(s.data(), seed->data(), seed_bytes);
  auto key = key_pair::from_seed(s);
  sodium_memzero(s.data(), s.size());
  if (key.public_key() != *pk)
    return fail(what + ": the public key does not derive from the seed (the file is corrupt)");
  return key;
}

std::string format_public_key(std::string_view public_key, key_role role) {
  return header_of(role, false) + to_hex(public_key) + "\n";
}

result<std::string> parse_public_key(std::string_view text, key_role role,
                                     const std::string& what) {
  std::string_view header = header_of(role, false);
  if (text.substr(0, std::strlen(header_of(role, true))) == header_of(role, true))
    return fail(what + ": this is a secret key file; pass the public key file (the .pub file "
                         "beside it) instead, a secret key never leaves its owner");
  auto expected = header.size() + 2 * public_key_bytes + 1;
  if (text.size() != expected)
    return fail(what + ": a " + std::string{role_name(role)} + " public key file is "
                + std::to_string(expected) + " bytes, this one is " + std::to_string(text.size()));
  if (text.substr(0, header.size()) != header)
    return fail(what + ": expected a first line '" + std::string{header.substr(0, header.size() - 1)}
                + "'");
  if (text.back() != '\n')
    return fail(what + ": expected the public key in hex and a newline");
  auto pk = from_hex(text.substr(header.size(), 2 * public_key_bytes));
  if (!pk)
    return fail(what + ": public key: " + pk.error().what);
  return *pk;
}

result<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(path + ": cannot open: " + errno_text());
  auto text = read_fd(fd, max_bytes, path);
  ::close(fd);
  if (text && text->size() > max_bytes)
    return fail(path + ": larger than the " + std::to_string(max_bytes) + " bytes expected");
  return text;
}

result<key_pair> load_secret_key_file(const std::string& path, key_role role) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(path + ": cannot open the " + std::string{role_name(role)}
                + " key file: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    auto why = errno_text();
    ::close(fd);
    return fail(path + ": cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(path + ": not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return fail(path + ": the key file has mode " + mode
                + " and may be read or changed by others; it must be private to its owner (chmod "
                  "600 "
                + path + ")");
  }
  auto text = read_fd(fd, secret_key_file_bytes(role), path);
  ::close(fd);
  if (!text)
    return text.error();
  auto key = parse_secret_key(*text, role, path);
  sodium_memzero(text->data(), text->size());
  return key;
}

status create_secret_key_file(const std::string& path, const key_pair& key, key_role role) {
  if (auto st = make_parent(path); !st)
    return st;
  std::string tmp = path + ".tmp.XXXXXX";
  // mkstemp creates the file with mode 0600 whatever the umask.
  int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    return fail(path + ": cannot create a temporary key file: " + errno_text());
  auto text = format_secret_key(key, role);
  auto st = write_all(fd, text, tmp);
  sodium_memzero(text.data(), text.size());
  if (st && ::fchmod(fd, 0600) != 0)
    st = fail(tmp + ": cannot set mode 0600: " + errno_text());
  if (st && ::fsync(fd) != 0)
    st = fail(tmp + ": cannot sync: " + errno_text());
  ::close(fd);
  // link() fails when `path` exists: two first starts at once cannot overwrite each other.
  if (st && ::link(tmp.c_str(), path.c_str()) != 0)
    st = fail(path + (errno == EEXIST ? ": exists already" : ": cannot create: " + errno_text()));
  ::unlink(tmp.c_str());
  return st;
}

result<loaded_key> load_or_create_key(const std::string& path, key_role role) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    auto key = key_pair::generate();
    auto created = create_secret_key_file(path, key, role);
    if (created)
      return loaded_key{key, true};
    // Another process created it meanwhile: load theirs. Any other failure is reported.
    if (::stat(path.c_str(), &st) != 0)
      return fail(created.what());
  }
  auto key = load_secret_key_file(path, role);
  if (!key)
    return key.error();
  return loaded_key{*key, false};
}

status write_public_key_file(const std::string& path, std::string_view public_key,
                             key_role role) {
  if (public_key.size() != public_key_bytes)
    return fail("a public key is 32 bytes, got " + std::to_string(public_key.size()));
  if (auto st = make_parent(path); !st)
    return st;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail(path + ": cannot create: " + errno_text());
  auto st = write_all(fd, format_public_key(public_key, role), path);
  ::close(fd);
  return st;
}

result<std::string> load_public_key_file(const std::string& path, key_role role) {
  auto text = read_small_file(path, 4096);
  if (!text)
    return text.error();
  return parse_public_key(*text, role, path);
}

} // namespace starling::actors::auth
