#include "runtime/experiment/serve.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "runtime/log/log.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime {

namespace {

constexpr const char* package_tag = "experiment";
constexpr const char* file_tag = "experiment-file";

bool file_key(const std::string& k) {
  return k == "path" || k == "eval_path" || k == "loss_file";
}

void scan(const YAML::Node& n, const std::string& at, std::vector<named_file>& out) {
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar())
        continue;
      auto k = it->first.Scalar();
      auto path = at.empty() ? k : at + "." + k;
      auto& v = it->second;
      if (k == "files" && v.IsSequence()) {
        for (size_t i = 0; i < v.size(); ++i)
          if (v[i].IsScalar() && !v[i].Scalar().empty())
            out.push_back({fmt::format("{}[{}]", path, i), v[i].Scalar(), {}, 0});
      } else if (file_key(k) && v.IsScalar()) {
        if (!v.Scalar().empty())
          out.push_back({path, v.Scalar(), {}, 0});
      } else {
        scan(v, path, out);
      }
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i)
      scan(n[i], fmt::format("{}[{}]", at, i), out);
  }
}

/// Reads a whole file of at most `max` bytes.
result<std::string> read_file(const std::string& path, uint64_t max) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec)
    return fail(fmt::format("{}: {}", path, ec.message()));
  if (size > max)
    return fail(fmt::format("{}: {} bytes, more than the {} a node serves", path, size, max));
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return fail(fmt::format("{}: cannot open the file", path));
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)))
    return fail(fmt::format("{}: cannot read the file", path));
  return bytes;
}

caf::behavior experiment_server(caf::event_based_actor* self, experiment_package pkg,
                                std::shared_ptr<node_gate> gate) {
  std::map<std::string, named_file> by_digest;
  for (auto& f : pkg.files)
    by_digest.emplace(f.digest, f);
  return {
      [=](messages::blob_msg& m) -> caf::result<messages::blob_msg> {
        if (!m.wire_error.empty())
          return caf::make_error(caf::sec::invalid_argument, "refused: " + m.wire_error);
        if (m.tag == package_tag) {
          auto out = pkg;
          auto& sender = self->current_sender();
          if (auto v = gate && sender ? gate->verdict_of(sender->node()) : std::nullopt) {
            out.reachable = v->kept;
            out.endpoint = v->endpoint;
            out.reach_detail = v->why;
          } else {
            out.reach_detail = "it claimed no endpoint in its hello";
          }
          auto bytes = encode_package(out);
          if (!bytes)
            return caf::make_error(caf::sec::invalid_argument, bytes.error().what);
          return messages::blob_msg{
              package_tag, std::vector<char>(bytes->begin(), bytes->end()), {}};
        }
        if (m.tag == file_tag) {
          auto i = by_digest.find(std::string(m.bytes.begin(), m.bytes.end()));
          if (i == by_digest.end())
            return caf::make_error(caf::sec::invalid_argument,
                                   "the experiment names no file of that digest");
          auto bytes = read_file(i->second.path, max_served_file_bytes);
          if (!bytes)
            return caf::make_error(caf::sec::invalid_argument, bytes.error().what);
          if (blake2b_256(*bytes) != i->second.digest)
            return caf::make_error(caf::sec::invalid_argument,
                                   i->second.path + " changed since the run started");
          return messages::blob_msg{file_tag, std::vector<char>(bytes->begin(), bytes->end()), {}};
        }
        return caf::make_error(caf::sec::invalid_argument,
                               "the experiment server answers only experiment and experiment-file");
      },
  };
}

/// One blob request to `who`, waited for.
result<std::string> ask(caf::actor_system& sys, const caf::actor& who, const std::string& tag,
                        std::string bytes, caf::timespan timeout) {
  caf::scoped_actor self{sys};
  result<std::string> out = fail("no answer");
  self->request(who, timeout, messages::blob_msg{tag, {bytes.begin(), bytes.end()}, {}})
      .receive(
          [&](const messages::blob_msg& r) {
            if (!r.wire_error.empty())
              out = fail("the answer was refused: " + r.wire_error);
            else if (r.tag != tag)
              out = fail("the answer is not " + tag);
            else
              out = std::string(r.bytes.begin(), r.bytes.end());
          },
          [&](caf::error& e) { out = fail(sys.render(e)); });
  return out;
}

} // namespace

result<std::vector<named_file>> scan_named_files(const std::string& yaml_text) {
  std::vector<named_file> out;
  try {
    scan(YAML::Load(yaml_text), "", out);
  } catch (const YAML::Exception& e) {
    return fail(fmt::format("the experiment file does not parse: {}", e.what()));
  }
  if (out.size() > max_named_files)
    return fail(fmt::format("the experiment names {} files, more than the {} a node serves",
                            out.size(), max_named_files));
  return out;
}

result<experiment_package> make_package(const std::string& file,
                                        const std::vector<std::string>& sets, uint64_t nodes,
                                        bool with_signature) {
  experiment_package p;
  auto yaml = read_file(file, max_experiment_bytes);
  if (!yaml)
    return yaml.error();
  p.yaml = std::move(*yaml);
  p.sets = sets;
  p.nodes = nodes;
  auto files = scan_named_files(p.yaml);
  if (!files)
    return fail(fmt::format("{}: {}", file, files.error().what));
  for (auto& f : *files) {
    auto bytes = read_file(f.path, max_served_file_bytes);
    if (!bytes)
      return fail(fmt::format("{} names {}: {}", f.key, f.path, bytes.error().what));
    f.size = bytes->size();
    f.digest = blake2b_256(*bytes);
  }
  p.files = std::move(*files);
  p.digest = experiment_digest(p.yaml, p.sets, p.files);
  auto sig_file = file + ".sig";
  std::error_code ec;
  if (with_signature && std::filesystem::exists(sig_file, ec)) {
    auto text = actors::auth::read_small_file(sig_file, 1024);
    if (!text)
      return fail(text.error().what);
    auto sig = parse_experiment_signature(*text);
    if (!sig)
      return fail(fmt::format("{}: {}", sig_file, sig.error().what));
    if (sig->digest != p.digest)
      return fail(fmt::format("{} signs another experiment (digest {}, this one {}): the file, a "
                              "file it names or the --set overrides changed since it was signed; "
                              "sign it again (starling authority sign-experiment)",
                              sig_file, actors::auth::to_hex(sig->digest).substr(0, 16),
                              actors::auth::to_hex(p.digest).substr(0, 16)));
    if (sig->nodes != nodes)
      return fail(fmt::format("{} signs the experiment for {} node{}, and this node runs it with "
                              "--nodes {}: joiners would refuse it; sign it again (starling "
                              "authority sign-experiment {} --nodes {})",
                              sig_file, sig->nodes, sig->nodes == 1 ? "" : "s", nodes, file,
                              nodes));
    p.signature = std::move(sig->signature);
  }
  if (auto b = encode_package(p); !b)
    return b.error();
  return p;
}

caf::actor spawn_experiment_server(caf::actor_system& sys, experiment_package package,
                                   std::shared_ptr<node_gate> gate) {
  return sys.spawn(experiment_server, std::move(package), std::move(gate));
}

result<experiment_package> fetch_package(node& nd, const std::string& endpoint,
                                         std::chrono::nanoseconds timeout, caf::actor* server_out) {
  auto& sys = nd.system();
  auto span = caf::timespan{timeout};
  caf::actor server;
  std::string why;
  {
    caf::scoped_actor self{sys};
    self->request(nd.resolver(), span, resolve_atom::value, endpoint + "/" + experiment_server_name)
        .receive([&](const caf::actor& a) { server = a; },
                 [&](caf::error& e) { why = sys.render(e); });
  }
  if (!server)
    return fail(why.empty() ? std::string{"no experiment server there"} : why);
  auto bytes = ask(sys, server, package_tag, {}, span);
  if (!bytes)
    return fail("asking for the experiment: " + bytes.error().what);
  auto pkg = decode_package(*bytes);
  if (!pkg)
    return pkg.error();
  if (auto st = check_package_digest(*pkg); !st)
    return fail(st.what());
  if (server_out)
    *server_out = server;
  return pkg;
}

result<fetched_experiment> fetch_experiment(node& nd, const std::string& endpoint,
                                            const std::string& authority_key,
                                            const std::string& dir,
                                            std::chrono::nanoseconds timeout) {
  auto& sys = nd.system();
  auto span = caf::timespan{timeout};
  caf::actor server;
  auto pkg = fetch_package(nd, endpoint, timeout, &server);
  if (!pkg)
    return pkg.error();
  if (!authority_key.empty()) {
    if (pkg->signature.empty())
      return fail("the run's experiment is not signed by its authority (its owner runs `starling "
                  "authority sign-experiment FILE --nodes N` and restarts the nodes); refused");
    if (!verify_experiment_signature(authority_key, pkg->digest, pkg->nodes, pkg->signature))
      return fail(fmt::format(
          "the experiment's signature is not the authority's for its digest {} and the node "
          "count it came with ({} node{}): the file, a file it names or the node count was "
          "changed on the way, or another key signed it; refused",
          actors::auth::to_hex(pkg->digest).substr(0, 16), pkg->nodes, pkg->nodes == 1 ? "" : "s"));
  }
  fetched_experiment out;
  out.signature_checked = !authority_key.empty();
  std::error_code ec;
  std::filesystem::create_directories(dir + "/files", ec);
  if (ec)
    return fail(fmt::format("cannot create {}/files: {}", dir, ec.message()));
  for (auto& f : pkg->files) {
    auto got = ask(sys, server, file_tag, f.digest, span);
    if (!got)
      return fail(fmt::format("fetching {} ({}): {}", f.key, f.path, got.error().what));
    if (got->size() != f.size || blake2b_256(*got) != f.digest)
      return fail(fmt::format("{} ({}) arrived with another size or digest than the experiment "
                              "says; refused",
                              f.key, f.path));
    auto path = dir + "/files/" + stored_file_name(f);
    if (auto st = actors::auth::write_file_atomically(path, *got, 0644); !st)
      return fail(st.what());
    out.file_sets.push_back(f.key + "=" + path);
  }
  out.package = std::move(*pkg);
  return out;
}

} // namespace starling::runtime
