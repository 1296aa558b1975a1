#include "runtime/cli/auth_cmd.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/certificates.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "messages/atoms.hpp"
#include "runtime/experiment/package.hpp"
#include "runtime/experiment/serve.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime {

namespace auth = actors::auth;

namespace {

/// A scratch folder removed with its files (the pushing node's key and token).
struct scratch_dir {
  std::string path;
  scratch_dir() {
    char tmpl[] = "/tmp/starling-push-XXXXXX";
    if (::mkdtemp(tmpl))
      path = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    if (!path.empty())
      std::filesystem::remove_all(path, ec);
  }
  bool ok() const { return !path.empty(); }
};

int die(const std::string& what) {
  fmt::print(stderr, "starling: error: {}\n", what);
  return 2;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// Hands `list` to the gates of the nodes at `endpoints`: the authority joins as a node of its
/// own run for a moment (a fresh key, a token it issues itself for ten minutes, TLS with its CA).
status push_deny_list(const auth::authority& a, const std::string& list,
                      const std::vector<std::string>& endpoints, bool tls) {
  if (endpoints.empty())
    return {};
  scratch_dir tmp;
  if (!tmp.ok())
    return fail("cannot create a temporary folder for the pushing node");
  node_options no;
  no.key_file = tmp.path + "/node.key";
  auto key = auth::load_or_create_key(no.key_file, auth::key_role::node);
  if (!key)
    return fail(key.error().what);
  auto issued = auth::issue_token(a, {key->key.public_key(), {std::string{auth::any_role}},
                                      now_ns(), int64_t{600} * 1'000'000'000, {}});
  if (!issued)
    return fail(issued.error().what);
  no.token = tmp.path + "/push.token";
  if (auto st = auth::write_file_atomically(no.token, issued->file_text, 0600); !st)
    return st;
  no.authority = a.dir + "/" + auth::authority_layout::public_key;
  no.tls = tls;
  no.data_endpoint = false;
  auto n = node::start(caf_options{}, no, "authority");
  if (!n)
    return fail(n.error().what);
  status out;
  for (auto& ep : endpoints) {
    caf::scoped_actor self{(*n)->system()};
    std::string why;
    uint64_t serial = 0;
    self->request((*n)->resolver(), std::chrono::seconds(15), resolve_atom::value,
                  ep + "/" + gate_name)
      .receive(
        [&](const caf::actor& gate) {
          self->request(gate, std::chrono::seconds(15), deny_atom::value, list)
            .receive([&](uint64_t s) { serial = s; },
                     [&](caf::error& e) { why = (*n)->system().render(e); });
        },
        [&](caf::error& e) { why = (*n)->system().render(e); });
    if (serial == 0) {
      out = fail(fmt::format("--push {}: {}", ep, why));
      break;
    }
    fmt::print("pushed to {}: deny list serial {} in force there (its gate passes it on)\n", ep,
               serial);
  }
  (*n)->shutdown();
  return out;
}

} // namespace

bool parse_duration(const std::string& text, int64_t& out_ns) {
  size_t pos = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9')
    ++pos;
  if (pos == 0 || pos > 9)
    return false;
  int64_t n = std::stoll(text.substr(0, pos));
  auto unit = text.substr(pos);
  int64_t scale = 0;
  if (unit.empty() || unit == "s")
    scale = 1'000'000'000;
  else if (unit == "ms")
    scale = 1'000'000;
  else if (unit == "m")
    scale = int64_t{60} * 1'000'000'000;
  else if (unit == "h")
    scale = int64_t{3600} * 1'000'000'000;
  else if (unit == "d")
    scale = int64_t{86400} * 1'000'000'000;
  else
    return false;
  out_ns = n * scale;
  return out_ns > 0;
}

auth_commands::auth_commands(CLI::App& app) {
  auto* key = app.add_subcommand("key", "A node's identity key");
  key->require_subcommand(1);
  key_init_ = key->add_subcommand("init", "Create the node key file (mode 0600) if it is missing, "
                                          "write FILE.pub and print the peer id");
  key_init_->add_option("--out", out_, "Key file (e.g. ~/.starling/node.key)")->required();

  auto* authority = app.add_subcommand("authority", "The run's authority (owner) key and CA");
  authority->require_subcommand(1);
  authority_init_ = authority->add_subcommand(
    "init", "Create an authority folder: key pair, experiment id, CA certificate, deny list");
  authority_init_->add_option("--out", out_, "Folder to create")->required();
  authority_init_->add_option("--experiment", experiment_,
                              "Experiment id (default: run-<12 hex digits of the key>)");

  sign_experiment_ = authority->add_subcommand(
    "sign-experiment", "Sign an experiment file (and the files it names) for joiners: writes "
                       "FILE.sig, which the run's nodes serve with it (`starling join` accepts "
                       "only an experiment its authority signed)");
  sign_experiment_->add_option("file", experiment_file_, "Experiment YAML file")->required();
  sign_experiment_->add_option("--authority", authority_dir_, "Authority folder")->required();
  sign_experiment_
      ->add_option("--nodes", nodes_,
                   "The run's node count (what its nodes get as --nodes): signed "
                   "with the file, joiners trust no other")
      ->required();
  sign_experiment_->add_option("--set", sets_,
                               "An override the nodes are started with (repeatable, in their "
                               "order): it is part of what is signed")
    ->allow_extra_args(false);

  auto* token = app.add_subcommand("token", "Access tokens signed by the authority");
  token->require_subcommand(1);
  token_issue_ = token->add_subcommand("issue", "Issue a token (and TLS certificate) for a node");
  token_issue_->add_option("--authority", authority_dir_, "Authority folder")->required();
  token_issue_->add_option("--peer-key", peer_key_file_, "The node's public key file (FILE.pub)")
    ->required();
  token_issue_->add_option("--role", roles_, "NAME[,NAME...] or any")->required();
  token_issue_->add_option("--expires", expires_, "Validity (30m, 6h, 7d; default 6h)");
  token_issue_->add_option("--out", out_, "Token file to write")->required();
  token_show_ = token->add_subcommand("show", "Print a token file's content (and verify it)");
  token_show_->add_option("file", token_file_, "Token file")->required();
  token_show_->add_option("--authority", authority_dir_, "Verify against this authority folder");

  deny_ = app.add_subcommand("deny", "Revoke a token or ban a node key (signs a new deny list)");
  deny_->add_option("--authority", authority_dir_, "Authority folder")->required();
  auto* id_opt = deny_->add_option("--token-id", token_id_hex_, "Token id (hex, from issued.log)");
  auto* key_opt = deny_->add_option("--peer-key", peer_key_file_, "Node public key file to ban");
  id_opt->excludes(key_opt);
  deny_->add_option("--reason", reason_, "Why (one line, told to the refused node)")->required();
  deny_->add_option("--for", for_, "How long (30m, 6h, 7d; default: for ever)");
  deny_->add_option("--push", push_,
                    "HOST:PORT of a running node of the run to hand the new list to (repeatable); "
                    "its gate passes it on to the nodes it knows");
  deny_->add_flag("--plain", push_plain_, "Push without TLS (the run's nodes have node.tls off)");
}

std::optional<int> auth_commands::run() const {
  if (key_init_->parsed())
    return key_init();
  if (authority_init_->parsed())
    return authority_init();
  if (token_issue_->parsed())
    return token_issue();
  if (token_show_->parsed())
    return token_show();
  if (deny_->parsed())
    return deny_add();
  if (sign_experiment_->parsed())
    return sign_experiment();
  return std::nullopt;
}

int auth_commands::key_init() const {
  auto key = auth::load_or_create_key(out_, auth::key_role::node);
  if (!key)
    return die(key.error().what);
  auto pub = out_ + ".pub";
  if (auto st = auth::write_public_key_file(pub, key->key.public_key(), auth::key_role::node); !st)
    return die(st.what());
  fmt::print("{} node key {}\npeer id {}\npublic key file {} (give it to the run's owner for a "
             "token)\n",
             key->created ? "created" : "loaded", out_, auth::to_hex(key->key.peer_id()), pub);
  return 0;
}

int auth_commands::authority_init() const {
  auth::authority_init_options opts;
  opts.dir = out_;
  opts.experiment = experiment_;
  opts.now_ns = now_ns();
  auto a = auth::init_authority(opts);
  if (!a)
    return die(a.error().what);
  fmt::print("authority created in {}\nexperiment {}\nauthority key {}\nCA certificate {}/ca.crt\n"
             "keep {}/authority.key secret; nodes trust {}/authority.pub\n",
             out_, a->experiment, auth::to_hex(a->key.public_key()), out_, out_, out_);
  return 0;
}

int auth_commands::token_issue() const {
  auto a = auth::load_authority(authority_dir_);
  if (!a)
    return die(a.error().what);
  auto peer = auth::load_public_key_file(peer_key_file_, auth::key_role::node);
  if (!peer)
    return die(peer.error().what);
  auto roles = auth::parse_roles(roles_);
  if (!roles)
    return die(roles.error().what);
  int64_t valid = 0;
  if (!parse_duration(expires_, valid))
    return die(fmt::format("--expires: expected a duration like 30m, 6h or 7d, got \"{}\"",
                           expires_));
  auto issued = auth::issue_token(*a, {*peer, *roles, now_ns(), valid, {}});
  if (!issued)
    return die(issued.error().what);
  if (auto st = auth::write_file_atomically(out_, issued->file_text, 0600); !st)
    return die(st.what());
  fmt::print("issued {}\nwrote {} (the token, the node's certificate and the CA's; mode 0600)\n",
             issued->content.describe(), out_);
  return 0;
}

int auth_commands::token_show() const {
  auto text = auth::read_small_file(token_file_, 64 * 1024);
  if (!text)
    return die(text.error().what);
  auto bytes = auth::parse_token_file(*text, token_file_);
  if (!bytes)
    return die(bytes.error().detail);
  auto t = auth::decode_token(*bytes);
  if (!t)
    return die(t.error().line());
  fmt::print("{}\ntoken id {}\n", t->describe(), auth::to_hex(t->id));
  if (authority_dir_.empty())
    return 0;
  auto a = auth::load_authority(authority_dir_);
  if (!a)
    return die(a.error().what);
  auto trust = a->trust();
  auto list_text = auth::read_small_file(authority_dir_ + "/deny.list", auth::max_deny_list_bytes);
  std::optional<auth::deny_list> deny;
  if (list_text)
    if (auto l = auth::verify_deny_list(*list_text, trust))
      deny = std::move(*l);
  auto v = auth::verify_token(*bytes, trust, now_ns(), deny ? &*deny : nullptr);
  if (!v) {
    fmt::print("invalid: {}\n", v.error().line());
    return 1;
  }
  fmt::print("valid for {}\n", a->experiment);
  return 0;
}

int auth_commands::sign_experiment() const {
  auto a = auth::load_authority(authority_dir_);
  if (!a)
    return die(a.error().what);
  if (nodes_ < 1 || nodes_ > max_package_nodes)
    return die(fmt::format("--nodes: expected the run's node count in [1, {}], got {}",
                           max_package_nodes, nodes_));
  // The signature binds the node count with the digest (package.hpp).
  auto p = make_package(experiment_file_, sets_, nodes_, false);
  if (!p)
    return die(p.error().what);
  experiment_signature sig{p->digest, nodes_,
                           a->key.sign(experiment_signing_message(p->digest, nodes_))};
  auto path = experiment_file_ + ".sig";
  if (auto st = auth::write_file_atomically(path, format_experiment_signature(sig), 0644); !st)
    return die(st.what());
  fmt::print("signed {} (digest {}, {} named file{}{}, {} node{}) for {}\nwrote {} (the run's "
             "nodes serve it with the experiment; each must run with --nodes {})\n",
             experiment_file_, auth::to_hex(p->digest).substr(0, 16), p->files.size(),
             p->files.size() == 1 ? "" : "s", sets_.empty() ? "" : ", with the --set overrides",
             nodes_, nodes_ == 1 ? "" : "s", a->experiment, path, nodes_);
  return 0;
}

int auth_commands::deny_add() const {
  auto a = auth::load_authority(authority_dir_);
  if (!a)
    return die(a.error().what);
  auth::deny_entry e;
  if (!token_id_hex_.empty()) {
    auto id = auth::from_hex(token_id_hex_);
    if (!id || id->size() != auth::token_id_bytes)
      return die("--token-id: expected 32 hex digits (a token id from issued.log)");
    e.kind = auth::deny_entry::kind_t::token;
    e.id = *id;
  } else if (!peer_key_file_.empty()) {
    auto pk = auth::load_public_key_file(peer_key_file_, auth::key_role::node);
    if (!pk)
      return die(pk.error().what);
    e.kind = auth::deny_entry::kind_t::peer;
    e.id = *pk;
  } else {
    return die("deny: expected --token-id HEX or --peer-key FILE");
  }
  e.reason = reason_;
  auto now = now_ns();
  if (!for_.empty()) {
    int64_t d = 0;
    if (!parse_duration(for_, d))
      return die(fmt::format("--for: expected a duration like 30m, 6h or 7d, got \"{}\"", for_));
    e.until_ns = now + d;
  }
  auto list = auth::deny(*a, e, now);
  if (!list)
    return die(list.error().what);
  fmt::print("{} {} denied: {}\nwrote {}/deny.list\n",
             e.kind == auth::deny_entry::kind_t::token ? "token" : "peer",
             auth::to_hex(e.kind == auth::deny_entry::kind_t::token ? e.id
                                                                    : auth::peer_id_of(e.id))
               .substr(0, 12),
             e.reason, authority_dir_);
  std::fflush(stdout);
  if (auto st = push_deny_list(*a, *list, push_, !push_plain_); !st)
    return die(st.what());
  return 0;
}

} // namespace starling::runtime
