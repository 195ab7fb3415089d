// Greedy NMS on CUDA with no host synchronisation and a fixed-size output (keep (N,) bool).
//
// 1. Sort (nms_visit_order: by score, grouped by label) and gather the boxes and labels in that
//    order: all on the stream, no sizes read back.
// 2. suppression_mask_kernel: the pairwise suppression bits in 64-wide words, as torchvision and
//    mmcv build them: word (r, c) holds, for sorted box r, bit i set when r suppresses box
//    64 c + i (same label, IoU > threshold, r before it). Only words the scan reads are written:
//    c >= r's block, and c before the first block whose labels all follow r's block's labels
//    (with labels grouped, the mask is block-diagonal by label; this spares the IoUs and the
//    writes between groups).
// 3. greedy_scan_kernel: the greedy pass on the device (torchvision and mmcv's nms_rotated copy
//    the whole mask to the host for it; mmcv's nms scans on the device but with a __syncthreads
//    per kept box). Label groups never suppress each other, so they are scanned side by side:
//    the CUDA block of tile b scans the groups that start in tile b, one after the other (one
//    group, the whole pass, without labels). Per tile of 64 sorted boxes of its group:
//    - warp 0 decides the group's boxes of the tile in order from the tile's "removed" word and
//      the diagonal words (held two per lane, broadcast by shuffles): no memory traffic in the
//      loop;
//    - all threads then OR the words of the kept boxes into the "removed" words of the group's
//      later tiles (shared memory, atomicOr), coalesced along the mask rows.
//    Groups of one box are kept at once, without a pass of their own.
//    Two __syncthreads per tile. (A tile shared by two groups is read by both scans, each
//    deciding its own boxes: the words hold no bits between labels.)
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_utils.cuh"
#include "nms_keep_mask/nms_keep_mask.h"
#include "nms_keep_mask/nms_keep_mask_math.h"

namespace redet {
namespace {

constexpr int kBlockBoxes = 64;  // bits of a mask word
constexpr int kScanThreads = 512;
constexpr int kColumnLanes = 32;  // suppression_mask_kernel's grid width
constexpr unsigned kFullWarp = 0xffffffffu;

using Word = unsigned long long;

// First block (> block) whose first sorted label is past the last label of `block`, or
// num_blocks: the blocks before it are the only ones that can share a label with `block`.
// Without labels every later block can.
__device__ __forceinline__ int group_end_block(const int64_t* sorted_labels, int n, int block,
                                               int num_blocks) {
  if (sorted_labels == nullptr) return num_blocks;
  const int64_t last = sorted_labels[min(n, (block + 1) * kBlockBoxes) - 1];
  // The common answer first (two loads, not a search's dependent ones): the greedy scan asks
  // for every block in turn, and blocks of labels seen once (the pairs a multiclass NMS sets
  // apart) or of small groups end their group at once.
  if (block + 1 >= num_blocks || sorted_labels[(block + 1) * kBlockBoxes] > last) return block + 1;
  int lo = block + 2, hi = num_blocks;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sorted_labels[mid * kBlockBoxes] > last) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Grid (column lane, row block); 64 threads, one per row of the row block. The block of
// column lane j writes the row block's words of column blocks row_block + j, + j + gridDim.x, ...
// up to the end of its label group: a grid of a few column lanes, not one block per word, since
// most words are never read (the multiclass NMS's 30000 candidates are mostly groups of one:
// a square grid of 470 x 470 blocks would mostly start blocks with nothing to do).
template <typename scalar_t, int kDim>
__global__ void __launch_bounds__(kBlockBoxes)
suppression_mask_kernel(const scalar_t* __restrict__ sorted_boxes,
                        const int64_t* __restrict__ sorted_labels, int n, int num_blocks,
                        at::opmath_type<scalar_t> iou_threshold, Word* __restrict__ mask) {
  using acc_t = at::opmath_type<scalar_t>;
  const int row_block = blockIdx.y;
  // block-uniform, so every thread takes the loop's __syncthreads alike
  const int end_block = group_end_block(sorted_labels, n, row_block, num_blocks);
  const int row_start = row_block * kBlockBoxes;
  const int row_size = min(n - row_start, kBlockBoxes);
  __shared__ acc_t col_boxes[kBlockBoxes * kDim];
  __shared__ int64_t col_labels[kBlockBoxes];
  const int t = threadIdx.x;
  const bool has_row = t < row_size;
  const int row = row_start + t;
  acc_t box[kDim];
  int64_t label = 0;
  if (has_row) {
#pragma unroll
    for (int d = 0; d < kDim; ++d) box[d] = static_cast<acc_t>(sorted_boxes[row * int64_t(kDim) + d]);
    label = sorted_labels != nullptr ? sorted_labels[row] : 0;
  }
  for (int col_block = row_block + blockIdx.x; col_block < end_block; col_block += gridDim.x) {
    const int col_start = col_block * kBlockBoxes;
    const int col_size = min(n - col_start, kBlockBoxes);
    __syncthreads();  // every thread is done with the previous column block's boxes
    if (t < col_size) {
#pragma unroll
      for (int d = 0; d < kDim; ++d) {
        col_boxes[t * kDim + d] =
            static_cast<acc_t>(sorted_boxes[(col_start + t) * int64_t(kDim) + d]);
      }
      col_labels[t] = sorted_labels != nullptr ? sorted_labels[col_start + t] : 0;
    }
    __syncthreads();
    if (has_row) {
      Word bits = 0;
      for (int i = col_block == row_block ? t + 1 : 0; i < col_size; ++i) {
        if (suppresses<kDim>(box, &col_boxes[i * kDim], label, col_labels[i], iou_threshold)) {
          bits |= Word(1) << i;
        }
      }
      mask[static_cast<int64_t>(row) * num_blocks + col_block] = bits;
    }
  }
}

// Position one past the run of `label` that starts at sorted position `start` (labels sorted).
__device__ __forceinline__ int group_end(const int64_t* sorted_labels, int n, int start) {
  if (sorted_labels == nullptr) return n;
  const int64_t label = sorted_labels[start];
  int lo = start + 1, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sorted_labels[mid] > label) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Grid: num_blocks blocks of kScanThreads, block b for the groups starting in tile b (the
// header). Dynamic shared memory: num_blocks words, indexed by tile.
__global__ void __launch_bounds__(kScanThreads)
greedy_scan_kernel(const Word* __restrict__ mask, const int64_t* __restrict__ sorted_labels,
                   const int64_t* __restrict__ order, int n, int num_blocks,
                   bool* __restrict__ keep) {
  extern __shared__ Word removed[];  // bit i of word b: sorted box 64 b + i is suppressed
  __shared__ Word starts;            // bit i: a group starts at sorted box 64 tile + i
  __shared__ Word kept_word;         // the kept boxes of the current tile's group part
  __shared__ int group_stop;         // one past the current group's last sorted box
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int tile = blockIdx.x, tile_start = tile * kBlockBoxes;
  if (warp == 0) {
    Word found = 0;
    if (sorted_labels == nullptr) {
      found = tile == 0 ? 1 : 0;
    } else {
      for (int half = 0; half < 2; ++half) {
        const int p = tile_start + half * 32 + lane;
        const bool start = p < n && (p == 0 || sorted_labels[p] != sorted_labels[p - 1]);
        // A group of one box is kept and needs no pass: the multiclass NMS gives every pair
        // below score_thr a label of its own, most of its candidates.
        const bool alone = start && (p + 1 == n || sorted_labels[p + 1] != sorted_labels[p]);
        if (alone) keep[order[p]] = true;
        found |= Word(__ballot_sync(kFullWarp, start && !alone)) << (half * 32);
      }
    }
    if (lane == 0) starts = found;
  }
  __syncthreads();
  Word pending = starts;  // block-uniform
  while (pending != 0) {
    const int first = __ffsll(static_cast<long long>(pending)) - 1;
    pending &= pending - 1;
    const int group_start = tile_start + first;
    if (t == 0) group_stop = group_end(sorted_labels, n, group_start);
    __syncthreads();
    const int stop = group_stop, last_tile = (stop - 1) / kBlockBoxes;
    for (int b = tile + t; b <= last_tile; b += blockDim.x) removed[b] = 0;
    __syncthreads();
    for (int block = tile; block <= last_tile; ++block) {
      const int start = block * kBlockBoxes;
      // the group's boxes of this tile: in-tile positions [lo, hi)
      const int lo = max(group_start - start, 0), hi = min(stop - start, kBlockBoxes);
      if (warp == 0) {
        const int64_t first_row = static_cast<int64_t>(start) * num_blocks + block;
        const Word low = lane >= lo && lane < hi ? mask[first_row + int64_t(lane) * num_blocks] : 0;
        const Word high =
            lane + 32 >= lo && lane + 32 < hi ? mask[first_row + int64_t(lane + 32) * num_blocks] : 0;
        Word gone = removed[block];
        for (int i = lo; i < hi; ++i) {  // lo and hi are warp-uniform: every lane shuffles
          const Word row_word = __shfl_sync(kFullWarp, i < 32 ? low : high, i & 31);
          if (!((gone >> i) & 1)) gone |= row_word;
        }
        const Word below_hi = hi == kBlockBoxes ? ~Word(0) : (Word(1) << hi) - 1;
        const Word kept = ~gone & below_hi & ~((Word(1) << lo) - 1);
        if (lane >= lo && lane < hi) keep[order[start + lane]] = (kept >> lane) & 1;
        if (lane + 32 >= lo && lane + 32 < hi) {
          keep[order[start + lane + 32]] = (kept >> (lane + 32)) & 1;
        }
        if (lane == 0) kept_word = kept;
      }
      __syncthreads();
      const Word kept = kept_word;
      const int later = last_tile - block;  // the group's tiles after this one
      if (kept != 0 && later > 0) {
        // (kept row i, later tile j) pairs; consecutive threads read consecutive words of a row
        for (int p = t; p < kBlockBoxes * later; p += blockDim.x) {
          const int i = p / later, j = block + 1 + p % later;
          if ((kept >> i) & 1) {
            const Word w = mask[static_cast<int64_t>(start + i) * num_blocks + j];
            if (w != 0) atomicOr(&removed[j], w);
          }
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace

at::Tensor nms_keep_mask_cuda(const at::Tensor& boxes_, const at::Tensor& scores,
                              double iou_threshold, const std::optional<at::Tensor>& labels) {
  check_nms_keep_mask(boxes_, scores, iou_threshold, labels);
  c10::cuda::CUDAGuard guard(boxes_.device());
  const int64_t n64 = boxes_.size(0);
  auto keep = at::empty({n64}, boxes_.options().dtype(at::kBool));
  if (n64 == 0) return keep;
  const int n = static_cast<int>(n64);  // <= kNmsMaxBoxesCuda
  const int num_blocks = (n + kBlockBoxes - 1) / kBlockBoxes;
  const auto order = nms_visit_order(scores, labels).contiguous();
  const auto sorted_boxes = boxes_.index_select(0, order).contiguous();
  const auto sorted_labels =
      labels.has_value() ? labels->index_select(0, order).contiguous() : at::Tensor();
  const int64_t* label_data = sorted_labels.defined() ? sorted_labels.data_ptr<int64_t>() : nullptr;
  // Unwritten words (between label groups, below the diagonal) are never read.
  auto mask = at::empty({n64, num_blocks}, boxes_.options().dtype(at::kLong));
  Word* mask_data = reinterpret_cast<Word*>(mask.data_ptr<int64_t>());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto type = boxes_.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "nms_keep_mask_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const dim3 grid(std::min(num_blocks, kColumnLanes), num_blocks);
    const auto launch = [&](auto dim) {
      suppression_mask_kernel<scalar_t, decltype(dim)::value><<<grid, kBlockBoxes, 0, stream>>>(
          sorted_boxes.data_ptr<scalar_t>(), label_data, n, num_blocks,
          static_cast<acc_t>(iou_threshold), mask_data);
    };
    boxes_.size(1) == 5 ? launch(std::integral_constant<int, 5>{})
                        : launch(std::integral_constant<int, 4>{});
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  greedy_scan_kernel<<<num_blocks, kScanThreads, num_blocks * sizeof(Word), stream>>>(
      mask_data, label_data, order.data_ptr<int64_t>(), n, num_blocks, keep.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return keep;
}

}  // namespace redet
