#include "kernels/t2i/quality.hpp"

#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "kernels/models/stage_module.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

struct image_classifier::impl {
  torch::nn::Sequential net{nullptr};
  std::size_t inputs = 0;
};

image_classifier::image_classifier(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
image_classifier::image_classifier(image_classifier&&) noexcept = default;
image_classifier& image_classifier::operator=(image_classifier&&) noexcept = default;
image_classifier::~image_classifier() = default;

std::size_t image_classifier::input_size() const noexcept {
  return impl_->inputs;
}

result<image_classifier> image_classifier::train(const image_set& train,
                                                 const classifier_options& opts) {
  auto per = train.pixels_per_image();
  if (train.count == 0 || per == 0 || train.pixels.size() != train.count * per ||
      train.labels.size() != train.count)
    return fail("the classifier needs a non-empty, consistent image set");
  if (opts.hidden < 1 || opts.epochs < 1 || opts.batch < 1 || !(opts.learning_rate > 0))
    return fail("classifier options need hidden, epochs, batch and learning rate above 0");
  auto p = std::make_unique<impl>();
  p->inputs = per;
  auto in = static_cast<int64_t>(per), classes = static_cast<int64_t>(train.classes);
  p->net = torch::nn::Sequential(torch::nn::Linear(in, opts.hidden), torch::nn::ReLU(),
                                 torch::nn::Linear(opts.hidden, opts.hidden), torch::nn::ReLU(),
                                 torch::nn::Linear(opts.hidden, classes));
  {
    torch::NoGradGuard no_grad;
    auto gen = seeded_generator(splitmix64_combine(opts.seed, 0, 0xc1a5));
    for (auto& param : p->net->named_parameters()) {
      if (param.key().find("weight") != std::string::npos)
        param.value().normal_(0.0, std::sqrt(2.0 / static_cast<double>(param.value().size(1))),
                              gen);
      else
        param.value().zero_();
    }
  }
  auto n = static_cast<int64_t>(train.count);
  auto x = torch::from_blob(const_cast<float*>(train.pixels.data()), {n, in}, torch::kFloat);
  auto y = torch::from_blob(const_cast<uint8_t*>(train.labels.data()), {n}, torch::kUInt8)
               .to(torch::kLong);
  torch::optim::Adam adam(p->net->parameters(), torch::optim::AdamOptions(opts.learning_rate));
  p->net->train();
  for (int e = 0; e < opts.epochs; ++e) {
    auto gen = seeded_generator(splitmix64_combine(opts.seed, static_cast<uint64_t>(e) + 1, 0x0de));
    auto order = torch::randperm(n, gen, torch::kLong);
    for (int64_t b = 0; b < n; b += opts.batch) {
      auto ids = order.slice(0, b, std::min(n, b + opts.batch));
      adam.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(p->net->forward(x.index_select(0, ids)),
                                                       y.index_select(0, ids));
      loss.backward();
      adam.step();
    }
  }
  p->net->eval();
  return image_classifier(std::move(p));
}

result<std::vector<int64_t>> image_classifier::predict(const std::vector<float>& pixels,
                                                       std::size_t count) const {
  if (pixels.size() != count * impl_->inputs)
    return fail(fmt::format("expected {} images of {} pixels, got {} values", count, impl_->inputs,
                            pixels.size()));
  if (count == 0)
    return std::vector<int64_t>{};
  torch::NoGradGuard no_grad;
  auto x = torch::from_blob(const_cast<float*>(pixels.data()),
                            {static_cast<int64_t>(count), static_cast<int64_t>(impl_->inputs)},
                            torch::kFloat);
  auto pred = impl_->net->forward(x).argmax(1).contiguous();
  return std::vector<int64_t>(pred.data_ptr<int64_t>(), pred.data_ptr<int64_t>() + pred.numel());
}

result<double> image_classifier::accuracy(const std::vector<float>& pixels,
                                          const std::vector<uint8_t>& labels) const {
  if (labels.empty())
    return fail("accuracy needs at least one image");
  auto pred = predict(pixels, labels.size());
  if (!pred)
    return fail(pred.error().what);
  std::size_t right = 0;
  for (std::size_t i = 0; i < labels.size(); ++i)
    right += (*pred)[i] == labels[i];
  return static_cast<double>(right) / static_cast<double>(labels.size());
}

double quality_report::generated_mean() const noexcept {
  if (generated.empty())
    return 0.0;
  double sum = 0.0;
  for (auto& g : generated)
    sum += g.accuracy;
  return sum / static_cast<double>(generated.size());
}

std::string quality_json(const quality_report& report) {
  nlohmann::json per = nlohmann::json::array();
  for (auto& g : report.generated)
    per.push_back({{"caption", g.caption},
                   {"label", g.label},
                   {"samples", g.samples},
                   {"accuracy", g.accuracy}});
  nlohmann::json j = {{"classifier_accuracy",
                       {{"real", report.real},
                        {"reconstruction", report.reconstruction},
                        {"generated", report.generated_mean()}}},
                      {"test_images", report.test_images},
                      {"codebook_digest", report.codebook_digest},
                      {"per_caption", per}};
  return j.dump(2) + "\n";
}

status write_quality_json(const std::string& path, const quality_report& report) {
  std::ofstream out(path, std::ios::trunc);
  if (!out)
    return fail("cannot write " + path);
  out << quality_json(report);
  if (!out)
    return fail("cannot write " + path);
  return {};
}

} // namespace starling::kernels
