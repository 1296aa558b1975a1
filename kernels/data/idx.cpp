#include "kernels/data/idx.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <sys/stat.h>

#include <fmt/format.h>
#include <zlib.h>

namespace starling::kernels {

namespace {

struct gz_closer {
  void operator()(gzFile f) const {
    if (f)
      gzclose(f);
  }
};
using gz_ptr = std::unique_ptr<gzFile_s, gz_closer>;

/// Reads exactly `n` bytes; false when the file ends first (or on a read error).
bool read_exact(gzFile f, uint8_t* out, std::size_t n) {
  while (n > 0) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30));
    const int got = gzread(f, out, chunk);
    if (got <= 0)
      return false;
    out += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

uint32_t big_endian(const uint8_t* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

} // namespace

result<idx_array> read_idx(const std::string& path, std::size_t max_items) {
  if (!file_exists(path))
    return fail(fmt::format("idx file {}: not found", path));
  gz_ptr f{gzopen(path.c_str(), "rb")};
  if (!f)
    return fail(fmt::format("idx file {}: cannot open", path));
  uint8_t magic[4];
  if (!read_exact(f.get(), magic, 4))
    return fail(fmt::format("idx file {}: truncated: shorter than the 4-byte magic number", path));
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    return fail(fmt::format("idx file {}: bad magic number {:02x} {:02x} {:02x} {:02x}, expected "
                            "00 00 08 and 1 to 4 dimensions (unsigned-byte idx)",
                            path, magic[0], magic[1], magic[2], magic[3]));
  idx_array out;
  const std::size_t rank = magic[3];
  std::vector<uint8_t> header(4 * rank);
  if (!read_exact(f.get(), header.data(), header.size()))
    return fail(fmt::format("idx file {}: truncated: the header announces {} dimensions but ends "
                            "before their sizes",
                            path, rank));
  std::size_t item_size = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    const uint32_t n = big_endian(header.data() + 4 * i);
    if (n == 0 || n > (1u << 28))
      return fail(fmt::format("idx file {}: dimension {} has size {}, expected 1 to 2^28", path, i,
                              n));
    out.dims.push_back(n);
    if (i > 0)
      item_size *= n;
  }
  if (item_size > (std::size_t{1} << 28))
    return fail(fmt::format("idx file {}: items of {} bytes, at most 2^28 supported", path,
                            item_size));
  const std::size_t announced = out.dims[0];
  const bool partial = max_items > 0 && max_items < announced;
  const std::size_t items = partial ? max_items : announced;
  out.data.resize(items * item_size);
  // Read item by item so a truncated file reports how far it got.
  for (std::size_t i = 0; i < items; ++i)
    if (!read_exact(f.get(), out.data.data() + i * item_size, item_size))
      return fail(fmt::format("idx file {}: truncated: the header announces {} items of {} bytes, "
                              "the data ends within item {}",
                              path, announced, item_size, i));
  if (!partial) {
    uint8_t extra[1];
    if (gzread(f.get(), extra, 1) > 0)
      return fail(fmt::format("idx file {}: wrong count: bytes follow the {} items the header "
                              "announces",
                              path, announced));
  }
  out.dims[0] = static_cast<uint32_t>(items);
  return out;
}

result<image_set> load_idx_images(const std::string& images_path, const std::string& labels_path,
                                  std::size_t max_items) {
  auto images = read_idx(images_path, max_items);
  if (!images)
    return images.error();
  auto labels = read_idx(labels_path, max_items);
  if (!labels)
    return labels.error();
  if (images->dims.size() != 3)
    return fail(fmt::format("idx file {}: {} dimensions, expected 3 (images × rows × cols)",
                            images_path, images->dims.size()));
  if (labels->dims.size() != 1)
    return fail(fmt::format("idx file {}: {} dimensions, expected 1 (labels)", labels_path,
                            labels->dims.size()));
  if (images->dims[0] != labels->dims[0])
    return fail(fmt::format("idx files {} and {}: wrong counts: {} images but {} labels",
                            images_path, labels_path, images->dims[0], labels->dims[0]));
  image_set s;
  s.count = images->dims[0];
  s.rows = images->dims[1];
  s.cols = images->dims[2];
  s.classes = 10;
  s.source = images_path;
  for (std::size_t i = 0; i < s.count; ++i)
    if (labels->data[i] >= s.classes)
      return fail(fmt::format("idx file {}: label {} of item {}, expected 0 to {}", labels_path,
                              labels->data[i], i, s.classes - 1));
  s.labels = std::move(labels->data);
  s.pixels.resize(images->data.size());
  for (std::size_t i = 0; i < s.pixels.size(); ++i)
    s.pixels[i] = static_cast<float>(images->data[i]) / 255.0f;
  return s;
}

result<image_set> load_fashion_mnist(const std::string& dir, bool train, std::size_t max_items) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  return load_idx_images(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz",
                         max_items);
}

bool fashion_mnist_present(const std::string& dir) {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    if (!file_exists(dir + "/" + name))
      return false;
  return true;
}

image_set make_synthetic_images(std::size_t count, std::size_t side, std::size_t classes,
                                uint64_t seed, uint64_t stream, double noise) {
  image_set s;
  s.count = count;
  s.rows = side;
  s.cols = side;
  s.classes = classes;
  s.source = fmt::format("generated(seed {}, stream {}, {} classes, {}x{})", seed, stream, classes,
                         side, side);
  const std::size_t p = side * side;
  // Prototypes: per class a sum of three Gaussian blobs at random places, scaled into [0, 1].
  std::mt19937_64 proto_rng{seed * 0x9e3779b97f4a7c15ULL + 17};
  std::uniform_real_distribution<double> unit{0.0, 1.0};
  std::vector<std::vector<double>> proto(classes, std::vector<double>(p, 0.0));
  const double s_side = static_cast<double>(side);
  for (auto& pr : proto) {
    for (int blob = 0; blob < 3; ++blob) {
      const double cy = unit(proto_rng) * s_side, cx = unit(proto_rng) * s_side;
      const double width = (0.12 + 0.2 * unit(proto_rng)) * s_side;
      const double height = 0.4 + 0.6 * unit(proto_rng);
      for (std::size_t r = 0; r < side; ++r)
        for (std::size_t c = 0; c < side; ++c) {
          const double dy = static_cast<double>(r) - cy, dx = static_cast<double>(c) - cx;
          pr[r * side + c] += height * std::exp(-(dx * dx + dy * dy) / (2 * width * width));
        }
    }
    for (auto& v : pr)
      v = std::min(1.0, v);
  }
  std::mt19937_64 rng{(seed + 1) * 0xbf58476d1ce4e5b9ULL + stream * 0x94d049bb133111ebULL + 3};
  std::normal_distribution<double> normal{0.0, noise};
  s.pixels.resize(count * p);
  s.labels.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto label = static_cast<uint8_t>(i % classes);
    s.labels[i] = label;
    for (std::size_t j = 0; j < p; ++j)
      s.pixels[i * p + j] =
        static_cast<float>(std::clamp(proto[label][j] + normal(rng), 0.0, 1.0));
  }
  return s;
}

} // namespace starling::kernels
