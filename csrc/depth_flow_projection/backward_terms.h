// Backward of the depth-aware flow projection: the per-pixel math shared by the CPU and CUDA
// kernels.
//
// Source pixel y (flow F(y), weight w(y), G = t·F(y)) reaches up to four pixels x
// (flow_projection.h), and there d out(x)/d F(y) = −t·w/count(x) and
// d out(x)/d w(y) = −(G + out(x))/count(x). With ĝ(x) the gradient reaching pixel x's projected
// value (grad_output, plus with hole filling what the holes filled from x pass back:
// hole_fill_backward.h), the backward is two steps:
//   1. terms, per pixel x: a = ĝ(x)/count(x) (two values) and a·out(x); zero at a hole;
//   2. gather, per source pixel y: with S the sum of the terms of the pixels it reached,
//      grad F(y) = −t·w·(S.x, S.y) and grad w(y) = −(G.x·S.x + G.y·S.y + S.w).
// A gather then reads one record per reached pixel (one 16-byte load for float) instead of five
// planes (grad x, grad y, out x, out y, count), so an incoherent flow, whose neighbouring sources
// reach scattered pixels, costs a fifth of the cache transactions. No atomics: deterministic.
#pragma once
#include <stdint.h>

#include "depth_flow_projection/flow_projection.h"
#include "common/macros.h"

namespace redet {

// The per-pixel record of step 1: (ĝx/count, ĝy/count, their dot product with out, unused).
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) GradientTerms {
  acc_t x, y, w, unused;
};

// grad_output (B, 2, H, W) with any strides: an expanded (`.sum().backward()`) or transposed
// gradient is read in place, without a copy.
template <typename scalar_t>
struct GradView {
  const scalar_t* data;
  int64_t batch_stride, channel_stride, row_stride, column_stride;
  REDET_HOST_DEVICE scalar_t at(int64_t b, int channel, int y, int x) const {
    return data[b * batch_stride + channel * channel_stride + y * row_stride + x * column_stride];
  }
};

template <typename acc_t>
REDET_HOST_DEVICE GradientTerms<acc_t> pixel_terms(acc_t grad_x, acc_t grad_y, acc_t out_x,
                                                   acc_t out_y, acc_t count) {
  if (!(count > acc_t(0))) return {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};  // a hole
  const acc_t inv = acc_t(1) / count;
  const acc_t ax = grad_x * inv, ay = grad_y * inv;
  return {ax, ay, ax * out_x + ay * out_y, acc_t(0)};
}

template <typename acc_t>
REDET_HOST_DEVICE void add_terms(GradientTerms<acc_t>* sum, const GradientTerms<acc_t>& t) {
  sum->x += t.x;
  sum->y += t.y;
  sum->w += t.w;
}

// The rows and columns of the four pixels a source reached, in the scatter's order:
// (L,T) (R,T) (L,B) (R,B).
struct ReachedPixels {
  int y[4], x[4];
};

REDET_HOST_DEVICE ReachedPixels reached_pixels(const ProjectionCorners& c) {
  return {{c.top, c.top, c.bottom, c.bottom}, {c.left, c.right, c.left, c.right}};
}

// Step 2 for one source pixel, from S (the sum of its reached pixels' terms). A source that
// landed nowhere (outside, or a flow that is not finite) gets zero, whatever G is. The depth
// gradient is with respect to w; the caller converts it to depth.
template <typename acc_t>
REDET_HOST_DEVICE void source_gradient(bool landed, acc_t t, acc_t gx, acc_t gy, acc_t w,
                                       const GradientTerms<acc_t>& s, acc_t* grad_fx,
                                       acc_t* grad_fy, acc_t* grad_w) {
  if (!landed) {
    *grad_fx = *grad_fy = *grad_w = acc_t(0);
    return;
  }
  *grad_fx = -t * w * s.x;
  *grad_fy = -t * w * s.y;
  *grad_w = -(gx * s.x + gy * s.y + s.w);
}

// A source pixel's weight, 0 when its depth input is invalid (depth_is_valid): such a pixel
// contributed nothing (check_depth=False, or in a CUDA graph) and gets no gradient.
template <typename acc_t>
REDET_HOST_DEVICE acc_t source_weight(acc_t depth, bool inverse_depth, bool* valid) {
  *valid = depth_is_valid(depth, inverse_depth);
  return *valid ? projection_weight(depth, inverse_depth) : acc_t(0);
}

// The gradient with respect to the depth input as given: w itself, or D with w = 1/D (dw/dD = −w²).
template <typename acc_t>
REDET_HOST_DEVICE acc_t depth_gradient(acc_t grad_w, acc_t w, bool inverse_depth) {
  return inverse_depth ? grad_w : -grad_w * w * w;
}

}  // namespace redet
