// Your own LibTorch training loop, trained together with other processes: the collaborative
// optimizer (runtime/own_loop/collaborative_optimizer.hpp) replaces `optimizer.step()`; data,
// forward and backward stay the user's. A small MLP learns a fixed teacher function; every
// process draws its own samples.
//
//   example_own_loop --name a                          # prints "listening on 127.0.0.1:PORT"
//   example_own_loop --name b --join 127.0.0.1:PORT    # the second peer joins the first
//
// Each peer trains until the run reaches `--steps` global steps, then prints its final global
// step and a digest of its parameters: peers that stepped together print the same digest.
#include <chrono>
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "runtime/own_loop/collaborative_optimizer.hpp"

namespace own = starling::runtime::own_loop;

namespace {

/// A batch of `n` samples of the teacher y = sin(x . w) + 0.5 x0, drawn from `rng`.
std::pair<torch::Tensor, torch::Tensor> batch(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> normal;
  auto x = torch::empty({n, 8});
  auto* p = x.data_ptr<float>();
  for (int64_t i = 0; i < n * 8; ++i)
    p[i] = normal(rng);
  auto w = torch::linspace(-1, 1, 8);
  auto y = torch::sin(x.matmul(w)) + 0.5 * x.select(1, 0);
  return {x, y.unsqueeze(1)};
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"own_loop: a user's own LibTorch loop trained with a collaboration"};
  std::string name = "a";
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;
  size_t peers = 2;
  uint64_t steps = 5, target = 256, batch_size = 32, seed = 1, data_seed = 0;
  double max_seconds = 60;
  bool fresh_groups = false;
  app.add_option("--name", name, "this peer's name (and its data stream)");
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any)");
  app.add_option("--join", join, "HOST:PORT of a peer already in the run");
  app.add_option("--peers", peers, "wait until this many peers are in the run (1: start alone)");
  app.add_option("--steps", steps, "global steps to train");
  app.add_option("--target", target, "samples per global step, over the whole run");
  app.add_option("--batch", batch_size, "samples per local batch");
  app.add_option("--seed", seed, "model seed (equal on every peer)");
  app.add_option("--data-seed", data_seed, "data seed (0: from the name)");
  app.add_option("--max-seconds", max_seconds, "give up after this long");
  app.add_flag("--fresh-groups", fresh_groups, "match every step's group anew (newcomers get in "
               "at once; each step waits the matchmaking window)");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  // --- the user's model, optimizer and data: nothing collaborative yet ---
  torch::manual_seed(seed);
  auto model = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 1));
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  std::mt19937_64 rng{data_seed != 0 ? data_seed : std::hash<std::string>{}(name)};
  auto [hx, hy] = batch(rng, 512); // held out

  // --- join the run ---
  own::options o;
  o.run = "own-loop-example";
  o.name = name;
  o.listen = listen;
  o.bootstrap = join;
  o.target_batch_size = target;
  o.persistent_groups = !fresh_groups;
  auto joined = own::collaborative_optimizer::join(adam, o);
  if (!joined) {
    fmt::print(stderr, "own_loop[{}]: error: {}\n", name, joined.error().what);
    return 2;
  }
  auto& collab = **joined;
  fmt::print("own_loop[{}]: listening on {}\n", name, collab.endpoint());
  std::fflush(stdout);
  if (peers > 1) {
    if (auto w = collab.wait_for_peers(peers, max_seconds); !w) {
      fmt::print(stderr, "own_loop[{}]: error: {}\n", name, w.what());
      return 1;
    }
    fmt::print("own_loop[{}]: {} peers in the run\n", name, peers);
    std::fflush(stdout);
  }

  // --- the user's loop: data, forward, backward; `collab.step` instead of `adam.step` ---
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  while (collab.global_step() < steps) {
    if (elapsed() > max_seconds) {
      fmt::print(stderr, "own_loop[{}]: error: {} global steps not reached in {} s (at {})\n",
                 name, steps, max_seconds, collab.global_step());
      return 1;
    }
    auto [x, y] = batch(rng, static_cast<int64_t>(batch_size));
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    auto s = collab.step(batch_size);
    if (s.outcome == own::step_outcome::accumulating)
      continue;
    if (s.outcome == own::step_outcome::failed) {
      fmt::print("own_loop[{}]: step failed ({}), going on\n", name, s.error);
      continue;
    }
    torch::NoGradGuard no_grad;
    // A lone step says why ("stepped alone: no_partner: ...").
    auto why = s.outcome == own::step_outcome::stepped_alone && !s.alone_reason.empty()
                 ? ": " + s.alone_reason
                 : std::string{};
    fmt::print("own_loop[{}]: global step {} ({}{}{}) held-out loss {:.4f} at {:.2f} s\n", name,
               s.global_step, own::to_string(s.outcome), why,
               s.state_averaged ? ", state averaged" : "",
               torch::mse_loss(model->forward(hx), hy).item<double>(), elapsed());
    std::fflush(stdout);
  }
  auto st = collab.stats();
  fmt::print("own_loop[{}]: done: global step {} digest {} (together {}, alone {}, downloads {}, "
             "samples {}) in {:.2f} s\n",
             name, collab.global_step(), collab.parameters_digest(), st.steps_together,
             st.steps_alone, st.downloads, st.samples, elapsed());
  std::fflush(stdout);
  return 0;
}
