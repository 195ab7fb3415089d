// RoIPool's vector path: each lane of a warp owns 2 adjacent channels of a channels-last map and
// reads them with one load (2 x 16 bit = one 32-bit word, 2 x fp32 = one 64-bit word), so a warp
// request covers 64 channels (128 B for 16-bit types, 256 B for fp32) and the per-pixel work
// (address, scan order, padding) is shared by the lane's 2 channels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "roi_pool/roi_pool_math.h"

namespace redet {

// The word holding a lane's 2 channels (the lower address, channel 2i, first); channel(w, 0 or 1)
// converts one to float exactly as the scalar kernels' static_cast<float> does; padding: both -inf.
// 16-bit pairs are one 32-bit integer word, so that the load, the padding select and the
// conversions are single 32-bit operations (a struct of two c10::Half is moved half by half).
template <typename scalar_t>
struct LanePair;

template <>
struct LanePair<float> {
  using Word = float2;
  __device__ static Word padding() { return make_float2(-INFINITY, -INFINITY); }
  __device__ static float channel(const Word& w, int i) { return i == 0 ? w.x : w.y; }
};

template <>
struct LanePair<c10::Half> {
  using Word = unsigned;
  __device__ static Word padding() { return 0xfc00fc00u; }  // float16 -inf, twice
  __device__ static float channel(Word w, int i) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i == 0 ? w : w >> 16)));
  }
};

template <>
struct LanePair<c10::BFloat16> {
  using Word = unsigned;
  __device__ static Word padding() { return 0xff80ff80u; }  // bfloat16 -inf, twice
  __device__ static float channel(Word w, int i) {
    return __uint_as_float(i == 0 ? w << 16 : w & 0xffff0000u);  // bfloat16 = top half of a float
  }
};

// a * b as a 64-bit product of two 32-bit ints: one multiply-add into an address (plain C++ 64-bit
// arithmetic on the promoted operands compiled to a 64 x 64-bit multiply, 4 instructions more).
__device__ __forceinline__ int64_t wide_product(int a, int b) {
  int64_t product;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(product) : "r"(a), "r"(b));
  return product;
}

// The pair form of bin_max_strided (roi_pool_math.h), for the 2 channels in the word
// at byte i * pixel_bytes from lane_base, pixel i = h * width + w (pixel_bytes = C * element size).
// Same scan order (row-major, batches of 8 loads in flight, padding past the last pixel -inf,
// which never wins), same rule per channel (start at -FLT_MAX, strict >, so the first max wins and
// NaN never does; empty bin -> value 0, index -1), compares in float like the CPU kernel: each
// channel's value and index are those of the scalar function. Addresses are 64-bit products of
// 32-bit ints: any map size, one multiply-add each.
template <typename scalar_t>
__device__ __forceinline__ void bin_max_lane_pair(
    const typename LanePair<scalar_t>::Word* __restrict__ lane_base, int width, int pixel_bytes,
    const PoolBin& b, float (&value)[2], int (&index)[2]) {
  using Pair = LanePair<scalar_t>;
  constexpr int kBatch = 8;
  const bool empty = b.empty();
  for (int i = 0; i < 2; ++i) {
    value[i] = empty ? 0.f : -3.402823466e+38f;
    index[i] = -1;
  }
  if (empty) return;
  const int bin_w = b.w_end - b.w_start;
  int next = b.h_start * width + b.w_start;   // flat index of the next pixel
  int column = 0;                             // its offset in the bin's row
  int left = (b.h_end - b.h_start) * bin_w;   // pixels not yet loaded
  // One batch: kBatch loads, then the compares in scan order. A full batch needs no padding (no
  // per-pixel test); only the last, partial one pads.
  const auto batch = [&](auto full) {
    typename Pair::Word v[kBatch];
    int at[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      at[u] = next;
      const auto* word = reinterpret_cast<const typename Pair::Word*>(
          reinterpret_cast<const char*>(lane_base) + wide_product(next, pixel_bytes));
      v[u] = decltype(full)::value || u < left ? *word : Pair::padding();
      if (++column == bin_w) {
        column = 0;
        next += width - bin_w + 1;
      } else {
        ++next;
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float x = Pair::channel(v[u], i);
        if (x > value[i]) {
          value[i] = x;
          index[i] = at[u];
        }
      }
    }
  };
  for (; left >= kBatch; left -= kBatch) batch(std::true_type{});
  if (left > 0) batch(std::false_type{});
}

}  // namespace redet
