// redet_infer MODEL.pt2 IMAGE.ppm [--score-thr 0.3]
//
// Runs a ReDet exported as an AOTInductor package (tools/export.py) on one image and prints one
// line per detection:
//   class score cx cy w h angle x1 y1 x2 y2 x3 y3 x4 y4
// (le90 box, angle in radians; the corners clockwise on screen, as RotatedBoxes.corners).
// Errors: one line on stderr and exit status 1 (2 for a bad command line).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "package_metadata.h"
#include "ppm_image.h"

namespace {

using redet_example::PackageInfo;
using redet_example::RgbImage;

const char* const kUsage = "usage: redet_infer MODEL.pt2 IMAGE.ppm [--score-thr 0.3]";

struct Options {
  std::string model_path;
  std::string image_path;
  double score_thr = 0.3;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_number(const std::string& text, const std::string& option) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw UsageError(option + " expects a number, got '" + text + "'");
  }
  return value;
}

Options parse_args(int argc, char** argv) {
  Options options;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::puts(kUsage);
      std::exit(0);
    } else if (arg == "--score-thr") {
      if (i + 1 >= argc) throw UsageError("--score-thr expects a number");
      options.score_thr = parse_number(argv[++i], arg);
    } else if (arg.rfind("--score-thr=", 0) == 0) {
      options.score_thr = parse_number(arg.substr(12), "--score-thr");
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) throw UsageError(kUsage);
  options.model_path = positional[0];
  options.image_path = positional[1];
  return options;
}

// The ops register themselves when libredet_ops is loaded; a package that calls one of them fails
// deep inside AOTInductor when it is not. Say what is wrong before that.
void require_ops_registered() {
  if (!c10::Dispatcher::singleton().findSchema({"redet::roi_pool", ""}).has_value()) {
    throw std::runtime_error(
        "the plugin's op library (libredet_ops) is not loaded: link it with --no-as-needed "
        "(see examples/cpp/CMakeLists.txt) or dlopen it before loading a package");
  }
}

// The loader's own errors name neither the file nor the usual cause: a package saved without
// --compile (an exported program, for Python only) or a file that is no package at all.
std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_package(const std::string& path) {
  if (!std::ifstream(path, std::ios::binary)) throw std::runtime_error(path + ": cannot open the file");
  try {
    return std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("Failed to find a generated cpp file or so file") != std::string::npos) {
      throw std::runtime_error(path + " is not an AOTInductor-compiled package (an exported "
                               "program?): export it with tools/export.py --compile");
    }
    if (what.find("zip archive") != std::string::npos) {
      throw std::runtime_error(path + " is not a package (not a PT2 zip archive): make one with "
                               "tools/export.py --compile");
    }
    throw std::runtime_error(path + ": cannot load the package: " + what);
  }
}

PackageInfo read_package_info(torch::inductor::AOTIModelPackageLoader& loader,
                              const std::string& model_path) {
  const auto metadata = loader.get_metadata();
  const auto found = metadata.find("redet");
  if (found == metadata.end()) {
    throw std::runtime_error(model_path + " has no \"redet\" metadata: export the detector with "
                             "tools/export.py (redet_plugin.inference.export)");
  }
  PackageInfo info = redet_example::parse_package_info(found->second);
  // Compiled code and the ops' schemas bind a package to the torch it was made with (the Python
  // loader refuses other versions too); the local tag ("+cpu", "+cu128") does not matter.
  const std::string made_with = info.torch_version.substr(0, info.torch_version.find('+'));
  if (!made_with.empty() && made_with != TORCH_VERSION) {
    throw std::runtime_error(model_path + " was exported with torch " + info.torch_version +
                             "; this program is built with torch " + TORCH_VERSION +
                             ": export it again with this torch, or build against that one");
  }
  return info;
}

// The package was compiled for one input size: a smaller image is padded at the bottom and the
// right with zeros (where the detector's own padding goes), a larger one is refused.
at::Tensor image_to_input(const RgbImage& image, const PackageInfo& info,
                          const std::string& image_path) {
  if (image.height > info.input_height || image.width > info.input_width) {
    throw std::runtime_error(
        image_path + " is " + std::to_string(image.height) + "x" + std::to_string(image.width) +
        " (HxW), larger than the package's input size " + std::to_string(info.input_height) +
        "x" + std::to_string(info.input_width) + ": crop or resize it, or export for a larger size");
  }
  at::Tensor input = at::zeros({info.input_height, info.input_width, 3}, at::kByte);
  uint8_t* out = input.data_ptr<uint8_t>();
  const uint8_t* in = image.pixels.data();
  for (int64_t y = 0; y < image.height; ++y) {
    for (int64_t x = 0; x < image.width; ++x) {
      const uint8_t* rgb = in + (y * image.width + x) * 3;
      uint8_t* bgr = out + (y * info.input_width + x) * 3;
      bgr[0] = rgb[2];  // the detector takes BGR, as OpenCV reads images
      bgr[1] = rgb[1];
      bgr[2] = rgb[0];
    }
  }
  return input;
}

// The device the package was compiled for, from AOTInductor's own metadata ("cpu", "cuda").
at::Device package_device(torch::inductor::AOTIModelPackageLoader& loader) {
  const auto metadata = loader.get_metadata();
  const auto found = metadata.find("AOTI_DEVICE_KEY");
  return at::Device(found == metadata.end() ? std::string("cpu") : found->second);
}

void print_detections(const std::vector<at::Tensor>& outputs, const PackageInfo& info,
                      double score_thr) {
  if (outputs.size() != 4) {
    throw std::runtime_error("the package returned " + std::to_string(outputs.size()) +
                             " outputs; expected 4 (boxes, scores, labels, count)");
  }
  const at::Tensor boxes = outputs[0].to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor scores = outputs[1].to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor labels = outputs[2].to(at::kCPU, at::kLong).contiguous();
  if (boxes.dim() != 2 || boxes.size(1) != 5 || scores.numel() != boxes.size(0) ||
      labels.numel() != boxes.size(0)) {
    throw std::runtime_error("the package's outputs do not have the shapes (N, 5), (N,), (N,)");
  }
  // Only the first `count` rows are detections; the rest pads the fixed-size outputs.
  const int64_t count = std::clamp<int64_t>(outputs[3].item<int64_t>(), 0, boxes.size(0));
  const float* box = boxes.data_ptr<float>();
  const float* score = scores.data_ptr<float>();
  const int64_t* label = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i, box += 5) {
    if (score[i] < score_thr) continue;
    const std::string name = label[i] >= 0 && label[i] < static_cast<int64_t>(info.classes.size())
                                 ? info.classes[label[i]]
                                 : "class_" + std::to_string(label[i]);
    const float cx = box[0], cy = box[1], w = box[2], h = box[3], angle = box[4];
    const float cos_a = std::cos(angle), sin_a = std::sin(angle);
    const float wx = w / 2 * cos_a, wy = w / 2 * sin_a;    // half the w side
    const float hx = -h / 2 * sin_a, hy = h / 2 * cos_a;   // half the h side
    std::printf("%s %.4f %.2f %.2f %.2f %.2f %.4f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f\n",
                name.c_str(), score[i], cx, cy, w, h, angle,
                cx - wx - hx, cy - wy - hy, cx + wx - hx, cy + wy - hy,
                cx + wx + hx, cy + wy + hy, cx - wx + hx, cy - wy + hy);
  }
}

int run(const Options& options) {
  require_ops_registered();
  const RgbImage image = redet_example::read_ppm(options.image_path);
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader = load_package(options.model_path);
  const PackageInfo info = read_package_info(*loader, options.model_path);
  const at::Device device = package_device(*loader);
  // As redet_plugin.deploy.load: on a GPU, float32 matrix products in TF32, as cuDNN runs
  // float32 convolutions by default.
  if (device.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
  const at::Tensor input = image_to_input(image, info, options.image_path).to(device);
  print_detections(loader->run({input}), info, options.score_thr);
  return 0;
}

// torch's errors span several lines (context, "Exception raised from ..."): keep one.
std::string one_line(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  const size_t end = message.find_last_not_of(' ');
  return end == std::string::npos ? message : message.substr(0, end + 1);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "redet_infer: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "redet_infer: %s\n", one_line(e.what_without_backtrace()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "redet_infer: %s\n", one_line(e.what()).c_str());
  }
  return 1;
}
