// A reader of binary PPM images (P6, 8 bits per channel): the format that needs no library.
// OpenCV writes it (cv2.imwrite("image.ppm", img)), as do ImageMagick and most editors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace redet_example {

struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  // height * width * 3 bytes, rows top to bottom, R G B
};

// Throws std::runtime_error with a one-line message naming the file and what is wrong.
RgbImage read_ppm(const std::string& path);

}  // namespace redet_example
