// `starling join HOST:PORT [HOST:PORT ...] [--token FILE]`: a volunteer's one command. It needs no
// experiment file: admitted by the first endpoint that answers, it fetches the run's experiment
// from there (runtime/experiment/serve.hpp; in a closed run only one the authority signed),
// writes it to its run folder, learns whether the run reaches it (the gate's probe of the
// endpoint its hello claimed: client mode when not, said in one line with the fix), takes an
// open slot of the plan (for `dedloc`: a data-parallel peer), works, prints its contribution as
// the run's ledger credits it, and leaves gracefully on SIGINT (a second one quits at once) or
// when its token expires (warned a minute before; `token_expiry_plan`). The run's `caf:`
// settings and its run-wide `node:` ones (data endpoint, congestion control) apply to the
// joiner: it fetched the experiment with CAF's defaults, so it starts its node again with them,
// on the port the run checked.
//
// Without `--token` it joins an OPEN run (no authority): a hello names the run it is for, and the
// joiner does not know an open run's name (its experiment's) before a node answered, so a
// throwaway node that names none asks the endpoints in turn and learns it from the first
// acceptor's own hello (`admission::take_foreign_acceptor`; one whose hello shows a token is a
// closed run's, refused with the fix in one line). The experiment is then accepted unsigned
// (`fetch_experiment` with no authority key), said in one line; without a key at the default
// path a fresh one is made in the run folder; there is no expiry plan.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace starling::runtime {

/// What `starling join` was given.
struct join_command {
  /// Nodes of the run to try, in turn.
  std::vector<std::string> endpoints;
  /// The token file (`starling token issue --peer-key FILE.pub`); empty: an open run.
  std::string token;
  /// The node key the token was issued for (default `$HOME/.starling/node.key`; in an open run
  /// without one there, `<out>/node.key`, made on first use).
  std::string key;
  /// Client mode whatever the run's verdict (accept no connection).
  bool client = false;
  /// Serve the run's page here (`HOST:PORT`; empty: none).
  std::string http;
  /// Listen here (empty: the local address that routes to the first endpoint, a free port).
  std::string listen;
  /// The endpoint the run should dial (a port forwarded to `listen`; empty: `listen`).
  std::string advertise;
  /// Run folder (empty: runs/<time>-join-<experiment>, or runs/<time>-join-open without a
  /// token).
  std::string out;
};

/// Runs `starling join`; returns the exit code (0 after a graceful leave, on SIGINT or at the
/// token's expiry, or the run's end; 1 when a leave's tombstone or slot release was not
/// acknowledged; 2 on a refusal or bad input; 3 when no node of the run can be reached or all
/// went away).
int command_join(const join_command& cmd);

/// When a joiner acts on its token's expiry, counted back from the expiry.
struct token_expiry_plan {
  /// The warning: a minute before, or half the time the token had left at the start when that
  /// is less than two minutes.
  std::chrono::nanoseconds warn_before{0};
  /// The graceful leave starts this long before the expiry, so that its round, tombstone and
  /// slot release are stored while the run's gates still admit the token (they refuse it from
  /// the expiry on): 30 s, or half of `warn_before` when that is less than a minute.
  std::chrono::nanoseconds leave_before{0};
};

/// The expiry plan of a token that has `left` to run when the joiner starts.
token_expiry_plan plan_token_expiry(std::chrono::nanoseconds left);

/// A duration for people: `42 s`, `3 min 05 s`, `5 h 59 min`.
std::string duration_text(std::chrono::nanoseconds d);

/// The fix a volunteer needs for a refusal line of the run (`your token was revoked: ...`), or
/// an empty string when the line names none. `with_token` false: the volunteer joined without
/// one, and a closed run's refusal says to get one (and how).
std::string join_refusal_hint(const std::string& line, bool with_token = true);

} // namespace starling::runtime
