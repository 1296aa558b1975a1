// The own-loop collaborative optimizer's refusals: bad options, optimizers whose state cannot
// travel, a bootstrap peer that does not answer. Each is an error value naming what was wrong.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <thread>

#include <torch/torch.h>

#include "runtime/own_loop/collaborative_optimizer.hpp"

namespace starling::test::runtime_own_loop_test {

namespace own = starling::runtime::own_loop;

namespace {

/// The message of `validate(o)`, empty when it passes.
std::string refusal(const own::options& o) {
  auto st = own::validate(o);
  return st ? std::string{} : st.what();
}

/// A loopback port that nobody listens on (bound, then closed).
uint16_t closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

} // namespace

TEST_CASE("own-loop options are validated with a message naming the option") {
  own::options o;
  CHECK(refusal(o).empty());
  auto bad = o;
  bad.run.clear();
  CHECK(refusal(bad).find("run") != std::string::npos);
  bad = o;
  bad.target_batch_size = 0;
  CHECK(refusal(bad).find("target_batch_size") != std::string::npos);
  bad = o;
  bad.listen = "localhost";
  CHECK(refusal(bad).find("listen") != std::string::npos);
  bad = o;
  bad.bootstrap = {"127.0.0.1:0"};
  CHECK(refusal(bad).find("bootstrap") != std::string::npos);
  bad = o;
  bad.round_timeout_s = -1;
  CHECK(refusal(bad).find("round_timeout_s") != std::string::npos);
  bad = o;
  bad.round_timeout_s = 0.2; // shorter than the matchmaking window
  CHECK(refusal(bad).find("matchmaking_s") != std::string::npos);
}

TEST_CASE("join refuses an optimizer whose state cannot travel, and a silent bootstrap peer") {
  torch::manual_seed(1);
  torch::nn::Linear model(4, 2);
  own::options o;
  {
    torch::optim::RMSprop rms(model->parameters(), torch::optim::RMSpropOptions(1e-2));
    auto j = own::collaborative_optimizer::join(rms, o);
    REQUIRE_FALSE(j);
    CHECK(j.error().what.find("unsupported optimizer") != std::string::npos);
  }
  {
    torch::optim::Adam ams(model->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
    auto j = own::collaborative_optimizer::join(ams, o);
    REQUIRE_FALSE(j);
    CHECK(j.error().what.find("amsgrad") != std::string::npos);
  }
  {
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-2));
    o.bootstrap = {"127.0.0.1:" + std::to_string(closed_port())};
    auto j = own::collaborative_optimizer::join(sgd, o);
    REQUIRE_FALSE(j);
    CHECK(j.error().what.find("bootstrap 127.0.0.1:") != std::string::npos);
  }
}

TEST_CASE("step reports a non-finite gradient as a failure and drops the batch") {
  torch::manual_seed(1);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-2));
  own::options o;
  o.target_batch_size = 1'000'000; // never reached here: no global step
  auto j = own::collaborative_optimizer::join(sgd, o);
  REQUIRE_MESSAGE(j, (j ? "" : j.error().what));
  auto& collab = **j;
  auto before = collab.parameters_digest();
  model->forward(torch::ones({2, 4})).sum().backward();
  auto ok = collab.step(2);
  CHECK(ok.outcome == own::step_outcome::accumulating);
  CHECK(ok.global_step == 0);
  CHECK(model->weight.grad().abs().sum().item<double>() == 0); // taken and zeroed
  model->forward(torch::full({2, 4}, std::numeric_limits<float>::quiet_NaN())).sum().backward();
  auto bad = collab.step(2);
  CHECK(bad.outcome == own::step_outcome::failed);
  CHECK(bad.error.find("NaN") != std::string::npos);
  CHECK(collab.stats().samples == 2);
  CHECK(collab.parameters_digest() == before);
  CHECK(collab.step(0).outcome == own::step_outcome::accumulating); // a poll
}

TEST_CASE("a peer alone in the run steps on its own gradient and says why") {
  torch::manual_seed(1);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-2));
  own::options o;
  o.target_batch_size = 2;
  auto j = own::collaborative_optimizer::join(sgd, o);
  REQUIRE_MESSAGE(j, (j ? "" : j.error().what));
  auto& collab = **j;
  model->forward(torch::ones({2, 4})).sum().backward();
  auto s = collab.step(2);
  for (int i = 0; i < 100 && s.outcome == own::step_outcome::accumulating; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = collab.step(0);
  }
  REQUIRE(s.outcome == own::step_outcome::stepped_alone);
  CHECK(s.global_step == 1);
  CHECK_FALSE(s.alone_reason.empty()); // no round: nobody else in the run
  auto polled = collab.step(0);
  CHECK(polled.outcome == own::step_outcome::accumulating);
  CHECK(polled.alone_reason.empty());
}

} // namespace starling::test::runtime_own_loop_test
