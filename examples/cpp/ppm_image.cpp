#include "ppm_image.h"

#include <cctype>
#include <fstream>
#include <stdexcept>

namespace redet_example {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// The header's fields are separated by whitespace, and '#' starts a comment up to the line end.
int64_t read_header_number(std::istream& in, const std::string& path, const char* field) {
  for (int c = in.peek(); c != EOF; c = in.peek()) {
    if (std::isspace(c)) {
      in.get();
    } else if (c == '#') {
      std::string comment;
      std::getline(in, comment);
    } else {
      break;
    }
  }
  int64_t value = 0;
  int digits = 0;
  while (std::isdigit(in.peek()) && digits < 9) {  // 9 digits: no overflow, and no real image is larger
    value = value * 10 + (in.get() - '0');
    ++digits;
  }
  if (digits == 0 || std::isdigit(in.peek())) {
    fail(path, std::string("bad PPM header: expected the ") + field + " as a number below 10^9");
  }
  return value;
}

}  // namespace

RgbImage read_ppm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  char magic[2] = {0, 0};
  in.read(magic, 2);
  if (!in || magic[0] != 'P' || magic[1] != '6') {
    fail(path, "not a binary PPM image (P6); convert it, e.g. cv2.imwrite('image.ppm', img)");
  }
  RgbImage image;
  image.width = read_header_number(in, path, "width");
  image.height = read_header_number(in, path, "height");
  const int64_t max_value = read_header_number(in, path, "maximum value");
  if (image.width == 0 || image.height == 0) fail(path, "the image is empty");
  if (max_value != 255) {
    fail(path, "only 8-bit PPM images are read (maximum value 255), this one has " +
                   std::to_string(max_value));
  }
  if (image.width * image.height > (int64_t{1} << 30)) {
    fail(path, "the image is too large (more than 2^30 pixels)");
  }
  if (!std::isspace(in.get())) fail(path, "bad PPM header: no whitespace before the pixels");
  image.pixels.resize(static_cast<size_t>(image.height * image.width * 3));
  in.read(reinterpret_cast<char*>(image.pixels.data()),
          static_cast<std::streamsize>(image.pixels.size()));
  if (in.gcount() != static_cast<std::streamsize>(image.pixels.size())) {
    fail(path, "the file ends before its " + std::to_string(image.height) + "x" +
                   std::to_string(image.width) + " (HxW) pixels do");
  }
  return image;
}

}  // namespace redet_example
