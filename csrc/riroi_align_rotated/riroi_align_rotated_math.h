// RiRoIAlignRotated geometry, shared by the CPU and CUDA kernels: RoI -> sample points, bilinear
// taps with the peer's (mmcv / ReDet) border rules, and orientation alignment.
//
// The expressions follow the peer's kernel operation by operation (same rounding), so that
// legacy_orientation=True reproduces it: float-rounded floor/ceil, the same association order.
#pragma once
#include <math.h>

#include "common/macros.h"

namespace redet {

constexpr double kTwoPi = 6.283185307179586;  // (double)(2 * M_PI), as the peer divides by it
// Samples per bin side: num_samples, or ceil(bin size) when it is 0 (adaptive). The cap (on
// num_samples, checked at the op boundary; on the adaptive count, applied here) keeps
// grid_h * grid_w within int, also for absurd (finite) RoIs.
constexpr int kMaxSamples = 1 << 12;

REDET_HOST_DEVICE int wrap_index(int i, int n) {
  i %= n;
  return i < 0 ? i + n : i;
}

template <typename acc_t>
struct RiRoIGeometry {
  acc_t center_x, center_y;  // RoI centre in feature-map pixels
  acc_t start_x, start_y;    // RoI's corner relative to its centre: (-w/2, -h/2)
  acc_t bin_w, bin_h;
  acc_t cos_t, sin_t;        // spatial rotation (the angle is negated when clockwise)
  int grid_w, grid_h;        // samples per bin side
  acc_t count;               // grid_w * grid_h: the average's divisor
  int shift;                 // floor(theta * nO / 2pi) mod nO: orientation channels to rotate by
  acc_t frac;                // theta * nO / 2pi - floor(...), in [0, 1]: weight of the neighbour
};

// roi = (batch_index, cx, cy, w, h, theta) in image coordinates; w and h are clamped to >= 1
// feature pixel as the peer does.
template <typename scalar_t, typename acc_t>
REDET_HOST_DEVICE RiRoIGeometry<acc_t> riroi_geometry(const scalar_t* roi, acc_t spatial_scale,
                                                     int out_h, int out_w, int num_samples,
                                                     int num_orientations, bool clockwise) {
  RiRoIGeometry<acc_t> g;
  g.center_x = static_cast<acc_t>(roi[1]) * spatial_scale;
  g.center_y = static_cast<acc_t>(roi[2]) * spatial_scale;
  acc_t roi_w = static_cast<acc_t>(roi[3]) * spatial_scale;
  acc_t roi_h = static_cast<acc_t>(roi[4]) * spatial_scale;
  acc_t theta = static_cast<acc_t>(roi[5]);
  roi_w = roi_w > acc_t(1) ? roi_w : acc_t(1);
  roi_h = roi_h > acc_t(1) ? roi_h : acc_t(1);
  g.bin_w = roi_w / static_cast<acc_t>(out_w);
  g.bin_h = roi_h / static_cast<acc_t>(out_h);
  g.start_x = static_cast<acc_t>(-roi_w / 2.0);
  g.start_y = static_cast<acc_t>(-roi_h / 2.0);

  // Orientation: a = theta * nO / 2pi. The peer floors a rounded to float (floorf); we do too,
  // then reduce mod nO in double so that any finite angle is safe.
  const acc_t a = static_cast<acc_t>(static_cast<double>(theta * static_cast<acc_t>(num_orientations)) / kTwoPi);
  const double whole = floor(static_cast<double>(static_cast<float>(a)));
  const acc_t frac = a - static_cast<acc_t>(whole);
  g.frac = frac < acc_t(0) ? acc_t(0) : (frac > acc_t(1) ? acc_t(1) : frac);
  g.shift = static_cast<int>(whole - num_orientations * floor(whole / num_orientations));
  g.shift = g.shift >= num_orientations ? 0 : g.shift;  // guards the rounding of huge angles

  if (clockwise) theta = -theta;  // the angle's sign flips for the spatial sampling only
  g.cos_t = cos(theta);
  g.sin_t = sin(theta);

  if (num_samples > 0) {
    g.grid_h = g.grid_w = num_samples;
  } else {
    const float per_bin_h = ceilf(static_cast<float>(roi_h / static_cast<acc_t>(out_h)));
    const float per_bin_w = ceilf(static_cast<float>(roi_w / static_cast<acc_t>(out_w)));
    g.grid_h = per_bin_h < kMaxSamples ? static_cast<int>(per_bin_h) : kMaxSamples;
    g.grid_w = per_bin_w < kMaxSamples ? static_cast<int>(per_bin_w) : kMaxSamples;
  }
  g.count = static_cast<acc_t>(g.grid_h * g.grid_w);
  return g;
}

// Sample (iy, ix) of bin (ph, pw), rotated about the RoI centre: feature-map coordinates (y, x).
template <typename acc_t>
REDET_HOST_DEVICE void riroi_sample_point(const RiRoIGeometry<acc_t>& g, int ph, int pw, int iy,
                                          int ix, acc_t* y, acc_t* x) {
  const acc_t yy = g.start_y + ph * g.bin_h +
                   static_cast<acc_t>(iy + .5f) * g.bin_h / static_cast<acc_t>(g.grid_h);
  const acc_t xx = g.start_x + pw * g.bin_w +
                   static_cast<acc_t>(ix + .5f) * g.bin_w / static_cast<acc_t>(g.grid_w);
  *y = yy * g.cos_t - xx * g.sin_t + g.center_y;
  *x = yy * g.sin_t + xx * g.cos_t + g.center_x;
}

// The four pixels (flat offsets y * width + x) and weights of a bilinear read at (y, x).
template <typename acc_t>
struct BilinearTaps {
  int offset[4];
  acc_t weight[4];
};

// The peer's border rules: a point more than one pixel outside the map reads 0 (returns false);
// within one pixel of the border it is clamped onto the border row/column. Pixel centres are at
// integer coordinates. Written as "not inside" so that a NaN point (a finite RoI whose size
// overflows once scaled: inf - inf) reads nothing too, instead of an index cast from NaN.
template <typename acc_t>
REDET_HOST_DEVICE bool bilinear_taps(int height, int width, acc_t y, acc_t x, BilinearTaps<acc_t>* t) {
  if (!(y >= acc_t(-1) && y <= static_cast<acc_t>(height) && x >= acc_t(-1) &&
        x <= static_cast<acc_t>(width))) {
    return false;
  }
  if (y <= acc_t(0)) y = 0;
  if (x <= acc_t(0)) x = 0;
  int y_low = static_cast<int>(y), x_low = static_cast<int>(x), y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<acc_t>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<acc_t>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const acc_t ly = y - static_cast<acc_t>(y_low), lx = x - static_cast<acc_t>(x_low);
  const acc_t hy = acc_t(1) - ly, hx = acc_t(1) - lx;
  t->offset[0] = y_low * width + x_low;
  t->offset[1] = y_low * width + x_high;
  t->offset[2] = y_high * width + x_low;
  t->offset[3] = y_high * width + x_high;
  t->weight[0] = hy * hx;
  t->weight[1] = hy * lx;
  t->weight[2] = ly * hx;
  t->weight[3] = ly * lx;
  return true;
}

// The bilinear taps of sample (iy, ix) of bin (ph, pw); false when the point reads nothing.
template <typename acc_t>
REDET_HOST_DEVICE bool sample_taps(const RiRoIGeometry<acc_t>& g, int ph, int pw, int iy, int ix,
                                   int height, int width, BilinearTaps<acc_t>* t) {
  acc_t y, x;
  riroi_sample_point(g, ph, pw, iy, ix, &y, &x);
  return bilinear_taps(height, width, y, x, t);
}

// Orientation alignment. Output channel o reads input orientation `o - shift` with weight
// (1 - frac) and its neighbour with weight frac. The neighbour that keeps the output continuous
// in theta is `o - shift - 1` (at frac -> 1 the output becomes that of shift + 1). The peer uses
// `o - shift + 1` (legacy: the output jumps by two channels at every theta = k * 2pi / nO).
REDET_HOST_DEVICE int neighbour_step(bool legacy) { return legacy ? 1 : -1; }

REDET_HOST_DEVICE int main_source(int o, int shift, int num_orientations) {
  return wrap_index(o - shift, num_orientations);
}

REDET_HOST_DEVICE int neighbour_source(int o, int shift, int num_orientations, bool legacy) {
  return wrap_index(o - shift + neighbour_step(legacy), num_orientations);
}

// The inverse maps (backward): input orientation j feeds output main_target(j) with weight
// (1 - frac) and output neighbour_target(j) with weight frac.
REDET_HOST_DEVICE int main_target(int j, int shift, int num_orientations) {
  return wrap_index(j + shift, num_orientations);
}

REDET_HOST_DEVICE int neighbour_target(int j, int shift, int num_orientations, bool legacy) {
  return wrap_index(j + shift - neighbour_step(legacy), num_orientations);
}

}  // namespace redet
