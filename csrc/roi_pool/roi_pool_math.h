// RoIPool bin geometry (Fast R-CNN, as torchvision computes it), shared by the CPU and CUDA kernels.
// Corners are rounded after scaling; a malformed RoI becomes 1x1; bins are floor/ceil of equal
// fractions of the RoI, clipped to the map. Arithmetic is done in scalar_t as torchvision does,
// so that float16 bins match it too.
#pragma once
#include <math.h>

#include "common/macros.h"

namespace redet {

struct PoolBin {
  int h_start, h_end, w_start, w_end;  // half-open, clipped to the map
  REDET_HOST_DEVICE bool empty() const { return h_end <= h_start || w_end <= w_start; }
};

// Rounded RoI corner in feature-map pixels; the clamp only keeps absurd (finite) values
// from overflowing int.
template <typename acc_t>
REDET_HOST_DEVICE int rounded_corner(acc_t coordinate, acc_t spatial_scale) {
  const acc_t v = round(coordinate * spatial_scale);  // half away from zero, like torchvision
  return static_cast<int>(fmin(fmax(static_cast<double>(v), -1e8), 1e8));
}

REDET_HOST_DEVICE int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// roi points at (batch, x1, y1, x2, y2); acc_t is float, or double for double input.
template <typename scalar_t, typename acc_t>
REDET_HOST_DEVICE PoolBin roi_pool_bin(const scalar_t* roi, acc_t spatial_scale, int ph, int pw,
                                      int pooled_h, int pooled_w, int height, int width) {
  const int x1 = rounded_corner(static_cast<acc_t>(roi[1]), spatial_scale);
  const int y1 = rounded_corner(static_cast<acc_t>(roi[2]), spatial_scale);
  const int x2 = rounded_corner(static_cast<acc_t>(roi[3]), spatial_scale);
  const int y2 = rounded_corner(static_cast<acc_t>(roi[4]), spatial_scale);
  const int roi_w = x2 - x1 + 1 > 1 ? x2 - x1 + 1 : 1;
  const int roi_h = y2 - y1 + 1 > 1 ? y2 - y1 + 1 : 1;
  const scalar_t bin_h = static_cast<scalar_t>(roi_h) / static_cast<scalar_t>(pooled_h);
  const scalar_t bin_w = static_cast<scalar_t>(roi_w) / static_cast<scalar_t>(pooled_w);
  PoolBin b;
  b.h_start = static_cast<int>(floor(static_cast<acc_t>(static_cast<scalar_t>(ph) * bin_h)));
  b.w_start = static_cast<int>(floor(static_cast<acc_t>(static_cast<scalar_t>(pw) * bin_w)));
  b.h_end = static_cast<int>(ceil(static_cast<acc_t>(static_cast<scalar_t>(ph + 1) * bin_h)));
  b.w_end = static_cast<int>(ceil(static_cast<acc_t>(static_cast<scalar_t>(pw + 1) * bin_w)));
  b.h_start = clamp_int(b.h_start + y1, 0, height);
  b.h_end = clamp_int(b.h_end + y1, 0, height);
  b.w_start = clamp_int(b.w_start + x1, 0, width);
  b.w_end = clamp_int(b.w_end + x1, 0, width);
  return b;
}

// Max over one bin of one channel; the pixel at flat index i = h * width + w is
// data[origin + i * pixel_stride] (pixel_stride 1 for an (N, C, H, W) plane, C for an (N, H, W, C)
// map). Returns the flat index of the max (the first one in row-major order on ties), or -1 and
// value 0 for an empty bin. Like torchvision, the search starts at -FLT_MAX and NaN never wins (so a
// bin of NaN / -inf gives -FLT_MAX and -1). index_t: int when every offset into data fits (on a GPU
// an address is then one multiply-add), else int64_t.
template <typename scalar_t, typename acc_t, typename index_t>
REDET_HOST_DEVICE int bin_max_strided(const scalar_t* data, index_t origin, int width,
                                      index_t pixel_stride, const PoolBin& b, acc_t* value) {
  if (b.empty()) {
    *value = acc_t(0);
    return -1;
  }
  // The bin's pixels in row-major order, kBatch at a time: the loads of a batch depend neither on
  // each other nor on the running max, so a GPU has them all in flight at once (bins are small:
  // a row-by-row loop would wait for memory every few pixels). The compares then run in scan
  // order; the padding past the last pixel is -inf, which never wins.
  constexpr int kBatch = 8;
  const int bin_w = b.w_end - b.w_start;
  const int count = (b.h_end - b.h_start) * bin_w;
  int next = b.h_start * width + b.w_start;  // flat index of the next pixel
  int column = 0;                            // its offset in the bin's row
  acc_t best = acc_t(-3.402823466e+38f);
  int best_index = -1;
  for (int left = count; left > 0; left -= kBatch) {  // left: pixels not yet loaded
    acc_t v[kBatch];
    int at[kBatch];
    for (int u = 0; u < kBatch; ++u) {
      at[u] = next;
      v[u] = u < left ? static_cast<acc_t>(data[origin + static_cast<index_t>(next) * pixel_stride])
                      : acc_t(-INFINITY);
      if (++column == bin_w) {
        column = 0;
        next += width - bin_w + 1;
      } else {
        ++next;
      }
    }
    for (int u = 0; u < kBatch; ++u) {
      if (v[u] > best) {
        best = v[u];
        best_index = at[u];
      }
    }
  }
  *value = best;
  return best_index;
}

}  // namespace redet
