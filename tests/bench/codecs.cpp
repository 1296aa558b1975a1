// Encode/decode throughput of every codec on 64 MB of fp32, single-threaded and with all threads,
// next to memcpy measured in the same run. GB/s are input (fp32) bytes per second.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "kernels/compress/codec.hpp"

using namespace starling::kernels;
using clk = std::chrono::steady_clock;

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clk::now();
    f();
    best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
  }
  return best;
}

} // namespace

int main() {
  const int64_t n = 16 << 20; // 64 MiB of fp32
  const double bytes = 4.0 * n;
  torch::manual_seed(0);
  auto x = torch::randn({n});
  std::vector<char> dst(static_cast<size_t>(bytes));
  const codec_id codecs[] = {codec_id::none,       codec_id::fp16,      codec_id::bf16,
                             codec_id::uniform8,   codec_id::blockwise8, codec_id::quantile8,
                             codec_id::topk,       codec_id::randk};
  int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, all}) {
    torch::set_num_threads(threads);
    double memcpy_s = best_seconds(5, [&] { std::memcpy(dst.data(), x.data_ptr<float>(), dst.size()); });
    double memcpy_gbs = bytes / memcpy_s / 1e9;
    std::printf("\nthreads=%d  memcpy %.2f GB/s (64 MiB, best of 5)\n", threads, memcpy_gbs);
    std::printf("%-11s %9s %7s %9s %7s %8s %10s\n", "codec", "enc GB/s", "%memcp", "dec GB/s",
                "%memcp", "ratio", "mse");
    for (auto c : codecs) {
      codec_params p; // topk/randk: ratio 0.01
      auto h = make_header(x, c, p);
      if (!h) {
        std::printf("%-11s %s\n", std::string{to_string(c)}.c_str(), h.error().what.c_str());
        continue;
      }
      auto size = payload_bytes(n, c, h->params);
      std::vector<uint8_t> payload(size);
      starling::status st;
      double enc = best_seconds(3, [&] { st = encode_into(x, *h, payload.data(), size); });
      at::Tensor y;
      double dec = best_seconds(3, [&] { y = *decode_payload(*h, payload.data(), size); });
      double mse = (y - x).pow(2).mean().item<double>();
      std::printf("%-11s %9.2f %6.0f%% %9.2f %6.0f%% %8.2f %10.3g%s\n",
                  std::string{to_string(c)}.c_str(), bytes / enc / 1e9,
                  100.0 * (bytes / enc / 1e9) / memcpy_gbs, bytes / dec / 1e9,
                  100.0 * (bytes / dec / 1e9) / memcpy_gbs, bytes / static_cast<double>(size), mse,
                  st.ok() ? "" : "  (encode failed)");
    }
  }
  return 0;
}
