#include <doctest/doctest.h>
#include <torch/torch.h>
TEST_CASE("torch works") { CHECK(torch::ones({2}).sum().item<float>() == 2.0f); }
