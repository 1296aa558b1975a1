#include "actors/btard/step_util.hpp"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "actors/auth/identity.hpp"

namespace starling::actors::btard {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

at::Tensor as_tensor(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())},
                          at::kFloat);
}

std::vector<float> as_vector(const at::Tensor& t) {
  auto c = t.to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

bool finite_values(const float* v, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (!std::isfinite(v[k]))
      return false;
  return true;
}

void note_clip(attempt_record& rec, const clip_outcome& c, size_t inputs) {
  rec.clipped += c.clipped;
  rec.inputs += inputs;
  rec.iterations = std::max(rec.iterations, c.iterations);
  rec.converged = rec.converged && c.converged;
}

digest mprng_secret(const auth::key_pair& key, uint64_t step, uint32_t attempt) {
  return hash_bytes("starling.btard.mprng-secret.v1" + key.seed() + le64(step) + le64(attempt));
}

void nesterov_step(std::vector<float>& params, std::vector<float>& velocity, size_t begin,
                   const float* g, size_t size, double lr, double momentum) {
  const auto mu = static_cast<float>(momentum);
  const auto rate = static_cast<float>(lr);
  float* v = velocity.data() + begin;
  float* th = params.data() + begin;
  for (size_t k = 0; k < size; ++k) {
    v[k] = mu * v[k] + g[k];
    th[k] -= rate * (g[k] + mu * v[k]);
  }
}

} // namespace starling::actors::btard
