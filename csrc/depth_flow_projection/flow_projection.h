// Depth-aware flow projection (DAIN), the per-pixel math shared by the CPU and CUDA kernels.
//
// A source pixel y with flow F(y) and weight w(y) = 1/depth(y) lands at p = y + G, G = t·F(y).
// If p lies inside [0, W-1] x [0, H-1] it adds (−w·G, w) to (sum, count) at the four pixels
// (L,T) (R,T) (L,B) (R,B), L = floor(p.x), R = min(L+1, W-1), T = floor(p.y), B = min(T+1, H-1),
// with equal weights (at the border one pixel can get the same contribution twice).
// Output = sum / count; pixels with count <= 0 are holes, optionally filled with the mean of the
// nearest non-holes to the left, right, top and bottom (flow_hole_fill.h). In the returned
// count a filled hole holds −(number of directions that found a non-hole), which is what the
// fill's backward needs. Accumulators are 4 values per pixel, pixel-major: (sum_x, sum_y, count, unused)
// (on CUDA, sums per corner (L, T), from which the pixels' sums follow: cuda/corner_sums.cuh).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/macros.h"

namespace redet {

// a + b rounded once, never fused with a preceding multiply into an FMA (nvcc fuses by default),
// so that the CPU and CUDA kernels take the same floor/inside decisions.
REDET_HOST_DEVICE float add_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

REDET_HOST_DEVICE double add_rounded(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

struct ProjectionCorners {
  int left, right, top, bottom;
};

// False when p is outside the image or not finite (such a source pixel is dropped).
template <typename acc_t>
REDET_HOST_DEVICE bool project_pixel(int x, int y, acc_t gx, acc_t gy, int width, int height,
                                     ProjectionCorners* c) {
  const acc_t px = add_rounded(static_cast<acc_t>(x), gx);
  const acc_t py = add_rounded(static_cast<acc_t>(y), gy);
  if (!(px >= acc_t(0) && px <= static_cast<acc_t>(width - 1) && py >= acc_t(0) &&
        py <= static_cast<acc_t>(height - 1))) {
    return false;
  }
  c->left = static_cast<int>(px);  // px >= 0, so truncation is floor
  c->top = static_cast<int>(py);
  c->right = c->left + 1 < width ? c->left + 1 : width - 1;
  c->bottom = c->top + 1 < height ? c->top + 1 : height - 1;
  return true;
}

// Is this depth input acceptable? depth > 0 (+inf allowed: weight 0), or an inverse depth finite
// and >= 0 (the op's check, check_depth_values, applies the same rule to the whole tensor). A
// source pixel with an invalid value contributes nothing and gets no gradient: with
// check_depth=False, or in a CUDA graph, where nothing raises.
template <typename acc_t>
REDET_HOST_DEVICE bool depth_is_valid(acc_t depth, bool inverse_depth) {
  return inverse_depth ? (depth >= acc_t(0) && isfinite(depth)) : depth > acc_t(0);
}

// The weight w from the depth input (which may already be 1/depth).
template <typename acc_t>
REDET_HOST_DEVICE acc_t projection_weight(acc_t depth, bool inverse_depth) {
  return inverse_depth ? depth : acc_t(1) / depth;
}

}  // namespace redet
