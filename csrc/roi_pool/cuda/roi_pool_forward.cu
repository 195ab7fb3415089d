// RoIPool's forward on CUDA (the backward: roi_pool_backward.cu), of one map or of several (an
// FPN's levels, roi_pool_multilevel): each RoI reads its own level's map from a table of them.
//
// Forward: a channels-last gather. Max pooling reads every pixel of a bin once per channel. On an
// (N, C, H, W) map the lanes of a warp read pixels of different bins or planes (scattered
// requests); on an (N, H, W, C) map the same pixel of consecutive channels is adjacent memory,
// one coalesced request. So the kernel takes the input channels-last (no copy when the caller's
// input already is; otherwise one tiled transpose, common/cuda/channels_last.cuh) and gives each
// warp one unit of work:
//   (chunk of 32 L consecutive channels, RoI k, bin row ph, up to kTileBins bins of the row);
// lane i owns the L channels chunk * 32 L + i L ... + L - 1 (lanes past C load nothing).
// L (kLaneChannels), the rule (lane_channels_for below):
//   L = 2 (vector path, roi_pool/cuda/lane_pair.cuh) for float, half and bfloat16 when C is even
//     and the input's data pointer is aligned to 2 elements: then every lane's pair starts at an
//     even element offset (pixel * C + even channel), one aligned 32-bit (16-bit types) or 64-bit
//     (fp32) load, and a warp request covers 64 channels (128 / 256 B) instead of 32 (64 / 128 B);
//   L = 1 (scalar path, bin_max_strided) otherwise: double (a 32-lane request is already 256 B),
//     odd C (a pair's offset would alternate between even and odd pixel by pixel), a misaligned
//     data pointer (a channels-last view with an odd storage offset).
// A bin's rectangle depends only on (k, ph, pw), so it is the same for all lanes: no divergence,
// and the scan order and tie rule are those of the CPU kernel (roi_pool_math.h), so
// output and argmax are identical on both paths.
// - A warp pools one bin row, not a whole RoI: a 64x64-pixel RoI would keep one warp busy for 4000+
//   loads while small RoIs finish early; many smaller units keep every SM busy to the end.
// - Units run chunk-major (every RoI on channels 0-63, then 64-127, ...): the warps in flight then
//   read one or two chunk slices of the map (20 MB at (2, 256, 200, 200) fp32 with L = 2), which
//   stay in L2, instead of the whole map (82 MB, more than L2) that RoI-major order would cycle
//   through.
// - Results go to the (K, C, ph, pw) output through a ChannelTile (common/cuda/channel_tile.cuh) of
//   32 L channel rows: a lane's bins are contiguous in the output, so the warp stores whole row
//   pieces, not scattered words. Output and argmax stay (K, C, ph, pw) contiguous.
// Per pixel of a full batch of 8 (sm_90 SASS): the scalar path 17 instructions for one channel,
// the vector path 15 for 2 16-bit channels, 13 for 2 fp32 ones (the address, scan step and padding
// are shared; what is left per channel is the conversion, compare and 2 selects).
// Why the vector path: with one channel a lane, a 16-bit warp request reads only 64 bytes and
// each pixel costs ~17 instructions for one channel.
// Bad rows: the RoI check (common/cuda/roi_checks.cuh) is enqueued before the kernel and read
// after it, or skipped in a CUDA graph; the kernel pools a row that breaks the rules of
// common/roi_rows.h as empty bins (0, argmax -1) and the backward skips it.
#include <ATen/OpMathType.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/cuda/channel_tile.cuh"
#include "common/cuda/channels_last.cuh"
#include "common/cuda/roi_checks.cuh"
#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"
#include "roi_pool/cuda/lane_pair.cuh"
#include "roi_pool/roi_pool.h"
#include "roi_pool/roi_pool_math.h"

namespace redet {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kTileBins = 8;  // bins of one row a warp pools at a time: a whole row of a 7x7 output
constexpr int64_t kMaxBlocks = 1 << 20;

// One warp's work: channels [chunk_start, chunk_start + channels) of RoI k, bins pw_start ..
// pw_start + bins - 1 of bin row ph. Numbered chunk-major:
// unit = ((chunk * num_rois + k) * pooled_h + ph) * groups_per_row + group.
struct PoolUnit {
  int64_t k;
  int chunk_start, channels, ph, pw_start, bins;
};

// chunk_size: 32 * the channels a lane owns.
__device__ __forceinline__ PoolUnit pool_unit(int64_t unit, int64_t num_rois, int channels,
                                              int chunk_size, int pooled_w, int groups_per_row,
                                              int units_per_roi) {
  PoolUnit u;
  const int64_t chunk_roi = unit / units_per_roi;  // chunk * num_rois + k
  const int in_roi = static_cast<int>(unit - chunk_roi * units_per_roi);
  u.ph = in_roi / groups_per_row;
  u.pw_start = (in_roi - u.ph * groups_per_row) * kTileBins;
  u.bins = min(kTileBins, pooled_w - u.pw_start);
  const int64_t chunk = chunk_roi / num_rois;
  u.k = chunk_roi - chunk * num_rois;
  u.chunk_start = static_cast<int>(chunk) * chunk_size;
  u.channels = min(chunk_size, channels - u.chunk_start);
  return u;
}

// Blocks an SM must hold at once (the __launch_bounds__ minimum), which caps the registers: 6
// blocks = 40 registers (48 warps an SM), 5 = 48 (40 warps), 4 = 64 (32 warps). Left to itself
// ptxas picks 40 to 72 depending on the variant, some with spills. 6 for 16-bit pairs and the
// scalar path with int offsets; 5 for fp32 pairs (46 registers; they spill at 40) and double
// (spills at 40); 4 for the int64 variants (huge maps only).
template <typename scalar_t, typename index_t, int kLaneChannels>
constexpr int min_blocks_per_sm() {
  if (sizeof(index_t) == 8) return 4;
  return sizeof(scalar_t) == 8 || (kLaneChannels == 2 && sizeof(scalar_t) == 4) ? 5 : 6;
}

// kLaneChannels: channels a lane owns (1: scalar path, 2: vector path; rule: lane_channels_for).
// index_t (scalar path): int when every offset into the input fits (an address is then one
// multiply-add).
template <typename scalar_t, typename index_t, int kLaneChannels>
__global__ void
__launch_bounds__(kWarpsPerBlock * kWarp, min_blocks_per_sm<scalar_t, index_t, kLaneChannels>())
roi_pool_forward_kernel(FeatureLevels<scalar_t, at::opmath_type<scalar_t>> levels,  // NHWC
                        bool multilevel, const int64_t* __restrict__ roi_levels,
                        const scalar_t* __restrict__ rois, int64_t num_rois, int64_t batch_size,
                        int channels, int pooled_h, int pooled_w, scalar_t* __restrict__ output,
                        int* __restrict__ argmax) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kChunk = kWarp * kLaneChannels;  // channels of one unit
  using ValueTile = ChannelTile<scalar_t, kTileBins, kChunk>;
  using IndexTile = ChannelTile<int, kTileBins, kChunk>;
  constexpr int kValueBytes = kWarpsPerBlock * ValueTile::elements() * sizeof(scalar_t);
  constexpr int kIndexBytes = kWarpsPerBlock * IndexTile::elements() * sizeof(int);
  __shared__ __align__(16) unsigned char tile_memory[kValueBytes + kIndexBytes];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  ValueTile values(reinterpret_cast<scalar_t*>(tile_memory) + warp * ValueTile::elements());
  IndexTile indices(reinterpret_cast<int*>(tile_memory + kValueBytes) +
                    warp * IndexTile::elements());
  __shared__ PoolBin bin_memory[kWarpsPerBlock][kTileBins];
  PoolBin* warp_bins = bin_memory[warp];  // the bins of the warp's unit

  const int groups_per_row = (pooled_w + kTileBins - 1) / kTileBins;
  const int units_per_roi = pooled_h * groups_per_row;
  const int64_t units = (channels + kChunk - 1) / kChunk * num_rois * units_per_roi;
  const int64_t bins = static_cast<int64_t>(pooled_h) * pooled_w;
  const int first = lane * kLaneChannels;  // this lane's first channel in the chunk
  // The loop bounds are the same for all lanes of a warp: the tiles' __syncwarp()s see every lane.
  for (int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; unit < units;
       unit += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const PoolUnit u =
        pool_unit(unit, num_rois, channels, kChunk, pooled_w, groups_per_row, units_per_roi);
    const scalar_t* roi = rois + u.k * 5;
    // A row that breaks the rules (common/roi_rows.h; the op raises after this kernel, or not at
    // all in a CUDA graph) pools empty bins: output 0, argmax -1 (no gradient). Warp-uniform.
    const int64_t level = roi_levels ? roi_levels[u.k] : 0;
    int64_t n = 0;
    const bool valid_roi = roi_row_image(roi, 5, batch_size, level, levels.count, &n);
    const int l = valid_roi ? static_cast<int>(level) : 0;
    const scalar_t* __restrict__ input = levels.data[l];
    const int height = levels.height[l], width = levels.width[l];
    // where the level's pixels start in the multi-level argmax (roi_pool.h), summed here: an array
    // of starts indexed by l would be copied from the parameters to the stack
    int start = 0;
    if (multilevel) {
      for (int j = 0; j < l; ++j) {
        start += static_cast<int>(batch_size) * levels.height[j] * levels.width[j];
      }
      start += static_cast<int>(n) * height * width;
    }
    // pixel i = h * width + w of channel c sits at input[(n * H * W + i) * C + c]
    const int64_t origin = n * height * width * channels + u.chunk_start + first;
    // C is a multiple of kLaneChannels on the vector path: a lane's channels are all valid or none.
    const bool active = first < u.channels;
    // Lane j works out bin j of the unit into shared memory (one pass instead of u.bins passes of
    // the whole warp: in 16-bit types the geometry is ~150 instructions a bin); the bin loop reads
    // it back (a broadcast), holding no registers for it across the loop.
    if (lane < u.bins) {
      warp_bins[lane] = valid_roi ? roi_pool_bin<scalar_t, acc_t>(
                                        roi, levels.spatial_scale[l], u.ph, u.pw_start + lane,
                                        pooled_h, pooled_w, height, width)
                                  : PoolBin{0, 0, 0, 0};
    }
    __syncwarp();
    for (int j = 0; j < u.bins; ++j) {
      const PoolBin b = warp_bins[j];
      acc_t value[kLaneChannels];
      int index[kLaneChannels];
      if constexpr (kLaneChannels == 1) {
        value[0] = acc_t(0);
        index[0] = -1;
        if (active) {
          index[0] = bin_max_strided<scalar_t, acc_t, index_t>(
              input, static_cast<index_t>(origin), width, static_cast<index_t>(channels), b,
              &value[0]);
        }
      } else {
        static_assert(kLaneChannels == 2, "the vector path pairs channels");
        value[0] = value[1] = acc_t(0);
        index[0] = index[1] = -1;
        if (active) {
          using Word = typename LanePair<scalar_t>::Word;
          bin_max_lane_pair<scalar_t>(reinterpret_cast<const Word*>(input + origin), width,
                                      channels * static_cast<int>(sizeof(scalar_t)), b, value,
                                      index);
        }
      }
#pragma unroll
      for (int i = 0; i < kLaneChannels; ++i) {
        values.put(first + i, j, static_cast<scalar_t>(value[i]));
        indices.put(first + i, j, index[i] < 0 ? index[i] : start + index[i]);
      }
    }
    const int64_t o = ((u.k * channels + u.chunk_start) * pooled_h + u.ph) * pooled_w + u.pw_start;
    values.store(output + o, u.channels, u.bins, bins, lane);
    indices.store(argmax + o, u.channels, u.bins, bins, lane);
  }
}

// The rule of the header comment: 2 channels a lane for float / half / bfloat16 when C is even and
// every level's data pointer holds 2 aligned elements, else 1.
inline int lane_channels_for(const std::vector<at::Tensor>& channels_last_levels) {
  for (const auto& level : channels_last_levels) {
    const auto type = level.scalar_type();
    const bool pair_type = type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
    const int64_t pair_bytes = 2 * level.element_size();
    const auto address = reinterpret_cast<std::uintptr_t>(level.data_ptr());
    if (!pair_type || level.size(1) % 2 != 0 || address % pair_bytes != 0) return 1;
  }
  return 2;
}

// Pools RoI k from features[levels[k]] (levels undefined: features holds one map); features and
// rois are checked but for the values of rois and levels.
RoIPoolResult pool_levels(at::TensorList features_, const at::Tensor& rois_,
                          const at::Tensor& levels_, at::ArrayRef<double> scales, int64_t pooled_h,
                          int64_t pooled_w, const char* op) {
  c10::cuda::CUDAGuard guard(features_[0].device());
  const int64_t batch_size = features_[0].size(0), channels = features_[0].size(1);
  // enqueued before the kernel, read after it (which skips bad rows itself): the GPU never waits
  DeferredRoiCheck roi_check(rois_, batch_size, levels_,
                             levels_.defined() ? static_cast<int64_t>(features_.size()) : 0);
  // (N, H, W, C) memory: no copy for a map that is already channels-last.
  std::vector<at::Tensor> features;
  for (const auto& feature : features_) features.push_back(to_channels_last(feature));
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_rois = rois.size(0);
  const auto options = features[0].options().memory_format(at::MemoryFormat::Contiguous);
  auto output = at::empty({num_rois, channels, pooled_h, pooled_w}, options);
  auto argmax = at::empty({num_rois, channels, pooled_h, pooled_w}, options.dtype(at::kInt));
  if (output.numel() == 0) {
    roi_check.raise_if_bad(op);
    return {output, argmax};
  }
  const int lane_channels = lane_channels_for(features);
  const int64_t chunk = kWarp * lane_channels;
  const int64_t units = (channels + chunk - 1) / chunk * num_rois * pooled_h *
                        ((pooled_w + kTileBins - 1) / kTileBins);
  // A block per 8 units, up to kMaxBlocks: units differ a lot in cost (RoI sides of a few to 64+
  // pixels) and the block scheduler balances them better than a grid-stride loop would.
  const int64_t blocks = std::min((units + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  bool int_offsets = true;
  for (const auto& feature : features) {
    int_offsets = int_offsets && feature.numel() <= std::numeric_limits<int>::max();
  }
  const int64_t* level_data = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, features[0].scalar_type(), "roi_pool_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto table = feature_levels<scalar_t, acc_t>(features, scales);
    const auto launch = [&](auto index_type, auto lanes) {
      using index_t = decltype(index_type);
      roi_pool_forward_kernel<scalar_t, index_t, decltype(lanes)::value>
          <<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
              table, levels.defined(), level_data, rois.data_ptr<scalar_t>(), num_rois, batch_size,
              channels, pooled_h, pooled_w, output.data_ptr<scalar_t>(), argmax.data_ptr<int>());
    };
    using One = std::integral_constant<int, 1>;
    // double has no vector path (lane_channels_for gives 1): no kernel is instantiated for it
    using Pair = std::integral_constant<int, std::is_same_v<scalar_t, double> ? 1 : 2>;
    if (lane_channels == 2) {
      launch(int{}, Pair{});  // index_t unused: the vector path's addresses are 64-bit products
    } else {
      int_offsets ? launch(int{}, One{}) : launch(int64_t{}, One{});
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  roi_check.raise_if_bad(op);  // waits for the check only; the kernel runs on
  return {output, argmax};
}

}  // namespace

RoIPoolResult roi_pool_forward_cuda(const at::Tensor& input, const at::Tensor& rois,
                                    double spatial_scale, int64_t pooled_h, int64_t pooled_w) {
  check_roi_pool_forward(input, rois, pooled_h, pooled_w, spatial_scale);
  return pool_levels({input}, rois, at::Tensor(), {spatial_scale}, pooled_h, pooled_w,
                     "roi_pool");
}

RoIPoolResult roi_pool_multilevel_forward_cuda(at::TensorList features, const at::Tensor& rois,
                                               const at::Tensor& levels,
                                               at::ArrayRef<double> spatial_scales,
                                               int64_t pooled_h, int64_t pooled_w) {
  check_roi_pool_multilevel_forward(features, rois, levels, spatial_scales, pooled_h, pooled_w);
  return pool_levels(features, rois, levels, spatial_scales, pooled_h, pooled_w,
                     "roi_pool_multilevel");
}

}  // namespace redet
