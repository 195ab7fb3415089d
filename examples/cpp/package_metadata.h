// What redet_infer needs from the package's metadata: the exporter stores a JSON object under the
// key "redet" (classes, input_size, torch, plugin, device, ...). Three fields are read, with a
// small JSON reader of our own: the example links libtorch and the op library, nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace redet_example {

struct PackageInfo {
  std::vector<std::string> classes;  // label i -> classes[i]
  int64_t input_height = 0;          // the fixed input size the package was compiled for
  int64_t input_width = 0;
  std::string torch_version;         // the torch that compiled it ("2.13.0+cpu"); may be empty
};

// Parses the "redet" metadata JSON; throws std::runtime_error (one line) when it is malformed or
// lacks "classes" or "input_size".
PackageInfo parse_package_info(const std::string& json);

}  // namespace redet_example
