#include "actors/auth/authority.hpp"

#include <sodium.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/auth/certificates.hpp"

namespace starling::actors::auth {

namespace {

std::string path_in(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
}

status append_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    return fail(path + ": cannot open: " + std::strerror(errno));
  auto text = line + "\n";
  auto n = ::write(fd, text.data(), text.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return fail(path + ": cannot append");
  return {};
}

} // namespace

trust_anchor authority::trust() const {
  trust_anchor t;
  t.authority_key = key.public_key();
  t.experiment = experiment;
  return t;
}

status write_file_atomically(const std::string& path, const std::string& text, unsigned mode) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    return fail(path + ": cannot create a temporary file: " + std::strerror(errno));
  size_t done = 0;
  status st;
  while (done < text.size()) {
    auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      st = fail(path + ": cannot write: " + std::strerror(errno));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (st && (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0))
    st = fail(path + ": cannot set its mode or sync: " + std::strerror(errno));
  ::close(fd);
  if (st && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = fail(path + ": cannot replace: " + std::strerror(errno));
  if (!st)
    ::unlink(tmp.c_str());
  return st;
}

result<authority> init_authority(const authority_init_options& opts) {
  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec)
    return fail(opts.dir + ": cannot create the folder: " + ec.message());
  ::chmod(opts.dir.c_str(), 0700);
  auto key_path = path_in(opts.dir, authority_layout::key);
  if (std::filesystem::exists(key_path, ec))
    return fail(key_path + " exists: this folder already holds an authority (never replaced: "
                           "its tokens would stop verifying)");
  auto key = key_pair::generate();
  authority a{opts.dir, key, opts.experiment, {}};
  if (a.experiment.empty())
    a.experiment = "run-" + to_hex(key.peer_id()).substr(0, 12);
  if (auto st = check_experiment_id(a.experiment); !st)
    return fail("--experiment: " + st.what());
  auto ca = make_ca_certificate(key, a.experiment, opts.now_ns, opts.now_ns + opts.ca_validity_ns);
  if (!ca)
    return ca.error();
  a.ca_pem = *ca;
  deny_list empty;
  empty.experiment = a.experiment;
  empty.serial = 1;
  empty.issued_at_ns = opts.now_ns;
  auto signed_deny = encode_deny_list(empty, key);
  if (!signed_deny)
    return signed_deny.error();
  // The key goes last but one: a folder with a key is complete except for its public copy.
  if (auto st = write_file_atomically(path_in(opts.dir, authority_layout::experiment),
                                      a.experiment + "\n", 0644);
      !st)
    return fail(st.what());
  if (auto st = write_file_atomically(path_in(opts.dir, authority_layout::ca), a.ca_pem, 0644); !st)
    return fail(st.what());
  if (auto st = write_file_atomically(path_in(opts.dir, authority_layout::deny), *signed_deny,
                                      0644);
      !st)
    return fail(st.what());
  if (auto st = create_secret_key_file(key_path, key, key_role::authority); !st)
    return fail(st.what());
  if (auto st = write_public_key_file(path_in(opts.dir, authority_layout::public_key),
                                      key.public_key(), key_role::authority);
      !st)
    return fail(st.what());
  return a;
}

result<authority> load_authority(const std::string& dir) {
  auto key = load_secret_key_file(path_in(dir, authority_layout::key), key_role::authority);
  if (!key)
    return key.error();
  auto exp_path = path_in(dir, authority_layout::experiment);
  auto exp = read_small_file(exp_path, 256);
  if (!exp)
    return exp.error();
  auto experiment = *exp;
  if (!experiment.empty() && experiment.back() == '\n')
    experiment.pop_back();
  if (auto st = check_experiment_id(experiment); !st)
    return fail(exp_path + ": " + st.what());
  auto ca_path = path_in(dir, authority_layout::ca);
  auto ca = read_small_file(ca_path, 64 * 1024);
  if (!ca)
    return ca.error();
  // The CA must be this key's own: a folder mixed from two authorities is refused.
  auto certs = pem_certificates(*ca);
  if (certs.size() != 1)
    return fail(ca_path + ": expected one PEM certificate");
  auto ca_key = certified_key(certs[0]);
  if (!ca_key)
    return fail(ca_path + ": " + ca_key.error().what);
  if (*ca_key != key->public_key())
    return fail(ca_path + ": the CA certificate is not the authority key's own");
  return authority{dir, *key, experiment, *ca};
}

result<issued_token> issue_token(const authority& a, const issue_options& opts) {
  if (opts.valid_ns <= 0)
    return fail("a token's validity must be positive");
  token t;
  if (opts.token_id.empty()) {
    t.id.resize(token_id_bytes);
    randombytes_buf(t.id.data(), t.id.size());
  } else {
    t.id = opts.token_id;
  }
  t.peer_key = opts.peer_key;
  t.roles = opts.roles;
  t.experiment = a.experiment;
  t.issued_at_ns = opts.now_ns;
  t.expires_at_ns = opts.now_ns + opts.valid_ns;
  auto signed_token = encode_token(t, a.key);
  if (!signed_token)
    return signed_token.error();
  t.authority_key = a.key.public_key();
  auto cert = make_node_certificate(a.key, a.experiment, t.peer_key, t.id, t.issued_at_ns,
                                    t.expires_at_ns);
  if (!cert)
    return cert.error();
  issued_token out{t, *signed_token, format_token_file(*signed_token) + *cert + a.ca_pem};
  if (auto st = append_line(path_in(a.dir, authority_layout::issued),
                            to_hex(t.id) + " " + t.describe());
      !st)
    return fail(st.what());
  return out;
}

result<std::string> deny(const authority& a, deny_entry entry, int64_t now_ns) {
  auto path = path_in(a.dir, authority_layout::deny);
  auto current = read_small_file(path, max_deny_list_bytes);
  if (!current)
    return current.error();
  auto list = verify_deny_list(*current, a.trust());
  if (!list)
    return fail(path + ": " + list.error().line());
  entry.added_at_ns = now_ns;
  list->entries.push_back(std::move(entry));
  list->serial += 1;
  list->issued_at_ns = now_ns;
  auto signed_list = encode_deny_list(*list, a.key);
  if (!signed_list)
    return signed_list.error();
  if (auto st = write_file_atomically(path, *signed_list, 0644); !st)
    return fail(st.what());
  return *signed_list;
}

} // namespace starling::actors::auth
