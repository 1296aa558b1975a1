// Encode/decode throughput of every codec on 64 MB of fp32, single-threaded and with all threads,
// next to memcpy measured in the same run. GB/s are input (fp32) bytes per second, steady state:
// one warm-up call, then the median of `reps` calls into buffers reused across calls.
// "dec" decodes into a caller-provided tensor (`decode_into`); "dec new" is `decode_payload`,
// which allocates a fresh 64 MB tensor per call and so pays its page faults every time.
//
// usage: bench_codecs [reps]   (default 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "kernels/compress/codec.hpp"

using namespace starling::kernels;
using clk = std::chrono::steady_clock;

namespace {

// Median seconds of `reps` calls after one warm-up call.
template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clk::now();
    f();
    t.push_back(std::chrono::duration<double>(clk::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const int64_t n = 16 << 20; // 64 MiB of fp32
  const double bytes = 4.0 * n;
  torch::manual_seed(0);
  auto x = torch::randn({n});
  std::vector<char> dst(static_cast<size_t>(bytes));
  const codec_id codecs[] = {codec_id::none,     codec_id::fp16,       codec_id::bf16,
                             codec_id::uniform8, codec_id::blockwise8, codec_id::quantile8,
                             codec_id::topk,     codec_id::randk};
  int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, all}) {
    torch::set_num_threads(threads);
    double memcpy_s =
        median_seconds(reps, [&] { std::memcpy(dst.data(), x.data_ptr<float>(), dst.size()); });
    double memcpy_gbs = bytes / memcpy_s / 1e9;
    std::printf("\nthreads=%d  memcpy %.2f GB/s (64 MiB, median of %d)\n", threads, memcpy_gbs,
                reps);
    std::printf("%-11s %9s %7s %9s %7s %9s %8s %10s\n", "codec", "enc GB/s", "%memcp", "dec GB/s",
                "%memcp", "dec new", "ratio", "mse");
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
      double enc = median_seconds(reps, [&] { st = encode_into(x, *h, payload.data(), size); });
      auto y = torch::empty({n});
      starling::status dst_st;
      double dec = median_seconds(reps, [&] { dst_st = decode_into(*h, payload.data(), size, y); });
      double dec_new =
          median_seconds(reps, [&] { (void)decode_payload(*h, payload.data(), size); });
      double mse = (y - x).pow(2).mean().item<double>();
      auto gbs = [&](double s) { return bytes / s / 1e9; };
      std::printf("%-11s %9.2f %6.0f%% %9.2f %6.0f%% %9.2f %8.2f %10.3g%s\n",
                  std::string{to_string(c)}.c_str(), gbs(enc), 100.0 * gbs(enc) / memcpy_gbs,
                  gbs(dec), 100.0 * gbs(dec) / memcpy_gbs, gbs(dec_new),
                  bytes / static_cast<double>(size), mse,
                  st.ok() && dst_st.ok() ? "" : "  (failed)");
    }
  }
  return 0;
}
