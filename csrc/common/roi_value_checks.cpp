#include "common/roi_value_checks.h"

namespace redet {
namespace {
thread_local bool checks_enabled = true;
}  // namespace

bool roi_value_checks_enabled() { return checks_enabled; }

bool set_roi_value_checks_enabled(bool enabled) {
  const bool previous = checks_enabled;
  checks_enabled = enabled;
  return previous;
}

}  // namespace redet
