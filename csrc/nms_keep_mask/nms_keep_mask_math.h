// The IoU of two boxes and the suppression rule of greedy NMS, shared by the CPU and CUDA kernels.
//
// Rotated boxes are (cx, cy, w, h, theta), theta in radians turning the w side from +x towards +y
// (mmcv's box_iou_rotated / nms_rotated with clockwise=True; redet_plugin/structures/rbox_ops.py).
// Their intersection is box a's rectangle clipped by box b's four sides (Sutherland-Hodgman),
// computed in b's own frame: b is then the axis-aligned [-w/2, w/2] x [-h/2, h/2], a clipped
// corner lands exactly on b's side, and a's centre enters only as the difference of the centres
// (exact for nearby boxes however large the coordinates). No convex hull, no sorting of points.
// mmcv's box_iou_rotated (its hull of edge-crossing and contained points) gives too small an IoU
// when one box lies inside the other and shares three of its edges (0.36 or 0 where the truth is
// 0.89: the coincident edges yield duplicated and missed points); clipping has no such case, and
// tests/test_ops/test_nms_keep_mask.py checks it against shapely.
//
// Horizontal boxes are (x1, y1, x2, y2) with mmcv's and torchvision's IoU (offset 0: the width
// is x2 - x1), computed in the same order of operations as mmcv's CPU nms.
//
// Box b suppresses box a when they have the same label and IoU > iou_threshold (strictly, as
// torchvision and mmcv's CUDA kernels; mmcv's CPU nms_rotated uses >=, which differs only when
// the IoU equals the threshold exactly).
#pragma once
#include <math.h>

#include "common/macros.h"

namespace redet {

// Most vertices the clipped polygon can have: 4 + one per clipping side; more only through
// rounding (near-duplicate points straddling a side), which is capped, not overrun.
constexpr int kClipVertices = 12;

// Keeps the part of the polygon (xs, ys)[0, n) where sign * coordinate <= limit (coordinate: x
// when kAlongX, else y); writes it to (out_x, out_y) and returns its vertex count. A vertex on
// the side is inside; a crossing gets the side's coordinate exactly.
template <typename T, bool kAlongX>
REDET_HOST_DEVICE int clip_by_side(const T* xs, const T* ys, int n, T sign, T limit, T* out_x,
                                   T* out_y) {
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const int k = i + 1 == n ? 0 : i + 1;
    const T pu = kAlongX ? xs[i] : ys[i], qu = kAlongX ? xs[k] : ys[k];
    const T dp = sign * pu - limit, dq = sign * qu - limit;  // > 0: outside
    if (dp <= 0 && m < kClipVertices) {
      out_x[m] = xs[i];
      out_y[m] = ys[i];
      ++m;
    }
    if (((dp < 0 && dq > 0) || (dp > 0 && dq < 0)) && m < kClipVertices) {
      const T t = dp / (dp - dq);
      const T crossing = kAlongX ? ys[i] + t * (ys[k] - ys[i]) : xs[i] + t * (xs[k] - xs[i]);
      out_x[m] = kAlongX ? sign * limit : crossing;
      out_y[m] = kAlongX ? crossing : sign * limit;
      ++m;
    }
  }
  return m;
}

// Area of the intersection of rotated boxes a and b, both with positive area and finite values.
template <typename T>
REDET_HOST_DEVICE T rotated_intersection_area(const T* a, const T* b) {
  // a's centre and axes in b's frame: rotate by -theta_b about b's centre
  const T cos_b = cos(b[4]), sin_b = sin(b[4]);
  const T dx = a[0] - b[0], dy = a[1] - b[1];
  const T cx = dx * cos_b + dy * sin_b, cy = dy * cos_b - dx * sin_b;
  const T turn = a[4] - b[4];
  const T c = cos(turn), s = sin(turn);
  const T half_w = fabs(a[2]) / 2, half_h = fabs(a[3]) / 2;
  const T ux = half_w * c, uy = half_w * s;    // a's half w side
  const T vx = -half_h * s, vy = half_h * c;   // a's half h side
  T xs[kClipVertices] = {cx - ux - vx, cx + ux - vx, cx + ux + vx, cx - ux + vx};
  T ys[kClipVertices] = {cy - uy - vy, cy + uy - vy, cy + uy + vy, cy - uy + vy};
  T tx[kClipVertices], ty[kClipVertices];
  const T limit_x = fabs(b[2]) / 2, limit_y = fabs(b[3]) / 2;
  int n = clip_by_side<T, true>(xs, ys, 4, T(1), limit_x, tx, ty);
  n = clip_by_side<T, true>(tx, ty, n, T(-1), limit_x, xs, ys);
  n = clip_by_side<T, false>(xs, ys, n, T(1), limit_y, tx, ty);
  n = clip_by_side<T, false>(tx, ty, n, T(-1), limit_y, xs, ys);
  if (n < 3) return T(0);
  // shoelace, as a fan from the first vertex (smaller terms than about the origin)
  T twice_area = 0;
  for (int i = 1; i + 1 < n; ++i) {
    twice_area += (xs[i] - xs[0]) * (ys[i + 1] - ys[0]) - (xs[i + 1] - xs[0]) * (ys[i] - ys[0]);
  }
  return fabs(twice_area) / 2;
}

template <typename T>
REDET_HOST_DEVICE bool all_finite(const T* v, int n) {
  bool finite = true;
  for (int i = 0; i < n; ++i) finite = finite && isfinite(v[i]);
  return finite;
}

// IoU of rotated boxes. 0 when either box has area w * h < 1e-14 (mmcv's rule) or a non-finite
// value, or when their circumscribed circles are apart (then the boxes are too; this spares the
// clipping for most pairs of an image).
template <typename T>
REDET_HOST_DEVICE T rotated_box_iou(const T* a, const T* b) {
  const T area_a = a[2] * a[3], area_b = b[2] * b[3];
  if (!(area_a >= T(1e-14) && area_b >= T(1e-14)) || !all_finite(a, 5) || !all_finite(b, 5)) {
    return T(0);
  }
  const T dx = a[0] - b[0], dy = a[1] - b[1];
  const T reach = (sqrt(a[2] * a[2] + a[3] * a[3]) + sqrt(b[2] * b[2] + b[3] * b[3])) / 2;
  if (dx * dx + dy * dy > reach * reach * T(1.0001)) return T(0);
  const T inter = rotated_intersection_area(a, b);
  return inter / (area_a + area_b - inter);
}

// IoU of horizontal boxes, as mmcv's CPU nms (offset 0) and torchvision compute it.
template <typename T>
REDET_HOST_DEVICE T horizontal_box_iou(const T* a, const T* b) {
  const T xx1 = a[0] > b[0] ? a[0] : b[0], yy1 = a[1] > b[1] ? a[1] : b[1];
  const T xx2 = a[2] < b[2] ? a[2] : b[2], yy2 = a[3] < b[3] ? a[3] : b[3];
  const T w = xx2 - xx1 > T(0) ? xx2 - xx1 : T(0), h = yy2 - yy1 > T(0) ? yy2 - yy1 : T(0);
  const T inter = w * h;
  const T area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

// kDim 5: rotated, 4: horizontal.
template <int kDim, typename T>
REDET_HOST_DEVICE T box_iou(const T* a, const T* b) {
  if constexpr (kDim == 5) {
    return rotated_box_iou(a, b);
  } else {
    return horizontal_box_iou(a, b);
  }
}

// Whether the kept box `kept` (higher in the order) suppresses `other`. Labels: equal ones only.
template <int kDim, typename T>
REDET_HOST_DEVICE bool suppresses(const T* kept, const T* other, long long kept_label,
                                  long long other_label, T iou_threshold) {
  return kept_label == other_label && box_iou<kDim>(kept, other) > iou_threshold;
}

}  // namespace redet
