// Deterministic accumulation: contributions are rounded to 64-bit fixed point and added with
// integer atomics. Integer addition is associative, so the sum is bitwise the same in any order.
// The scale is a power of two chosen from `bound` (an upper bound of the sum of all |contributions|
// into any one target, e.g. the sum of |grad_output|) so that no partial sum overflows 2^62.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/macros.h"

namespace redet {

REDET_HOST_DEVICE double fixed_point_scale(double bound) {
  if (!(bound > 0.0) || !isfinite(bound)) return 1.0;
  int exponent = 0;
  frexp(bound, &exponent);  // bound < 2^exponent
  return ldexp(1.0, 61 - exponent);
}

REDET_HOST_DEVICE long long to_fixed_point(double value, double scale) {
  return llrint(value * scale);
}

REDET_HOST_DEVICE double from_fixed_point(long long value, double scale) {
  return static_cast<double>(value) / scale;
}

}  // namespace redet
