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
// 3. greedy_scan_kernel: the greedy pass in one block, on the device (torchvision and mmcv's
//    nms_rotated copy the whole mask to the host for it; mmcv's nms scans on the device but with a
//    __syncthreads per kept box). Per block of 64 sorted boxes:
//    - warp 0 decides the 64 boxes in order from the block's "removed" word and the diagonal
//      words (held two per lane, broadcast by shuffles): no memory traffic in the loop;
//    - all threads then OR the words of the kept boxes into the "removed" words of the later
//      blocks of the same labels (shared memory, atomicOr), coalesced along the mask rows.
//    Two __syncthreads per 64 boxes.
#include <ATen/OpMathType.h>

#include <cstdint>

#include "common/cuda_utils.cuh"
#include "nms_keep_mask/nms_keep_mask.h"
#include "nms_keep_mask/nms_keep_mask_math.h"

namespace redet {
namespace {

constexpr int kBlockBoxes = 64;  // bits of a mask word
constexpr int kScanThreads = 512;
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

// Grid (column block, row block); 64 threads, one per row of the row block.
template <typename scalar_t, int kDim>
__global__ void __launch_bounds__(kBlockBoxes)
suppression_mask_kernel(const scalar_t* __restrict__ sorted_boxes,
                        const int64_t* __restrict__ sorted_labels, int n, int num_blocks,
                        at::opmath_type<scalar_t> iou_threshold, Word* __restrict__ mask) {
  using acc_t = at::opmath_type<scalar_t>;
  const int row_block = blockIdx.y, col_block = blockIdx.x;
  // Block-uniform exits (before any __syncthreads): words the scan never reads.
  if (col_block < row_block) return;
  if (col_block >= group_end_block(sorted_labels, n, row_block, num_blocks)) return;
  const int row_start = row_block * kBlockBoxes, col_start = col_block * kBlockBoxes;
  const int row_size = min(n - row_start, kBlockBoxes), col_size = min(n - col_start, kBlockBoxes);
  __shared__ acc_t col_boxes[kBlockBoxes * kDim];
  __shared__ int64_t col_labels[kBlockBoxes];
  const int t = threadIdx.x;
  if (t < col_size) {
#pragma unroll
    for (int d = 0; d < kDim; ++d) {
      col_boxes[t * kDim + d] =
          static_cast<acc_t>(sorted_boxes[(col_start + t) * int64_t(kDim) + d]);
    }
    col_labels[t] = sorted_labels != nullptr ? sorted_labels[col_start + t] : 0;
  }
  __syncthreads();
  if (t >= row_size) return;
  const int row = row_start + t;
  acc_t box[kDim];
#pragma unroll
  for (int d = 0; d < kDim; ++d) box[d] = static_cast<acc_t>(sorted_boxes[row * int64_t(kDim) + d]);
  const int64_t label = sorted_labels != nullptr ? sorted_labels[row] : 0;
  Word bits = 0;
  for (int i = row_block == col_block ? t + 1 : 0; i < col_size; ++i) {
    if (suppresses<kDim>(box, &col_boxes[i * kDim], label, col_labels[i], iou_threshold)) {
      bits |= Word(1) << i;
    }
  }
  mask[static_cast<int64_t>(row) * num_blocks + col_block] = bits;
}

// One block of kScanThreads; dynamic shared memory: num_blocks words.
__global__ void __launch_bounds__(kScanThreads)
greedy_scan_kernel(const Word* __restrict__ mask, const int64_t* __restrict__ sorted_labels,
                   const int64_t* __restrict__ order, int n, int num_blocks,
                   bool* __restrict__ keep) {
  extern __shared__ Word removed[];  // bit i of word b: sorted box 64 b + i is suppressed
  __shared__ Word kept_word;         // the kept boxes of the current block
  __shared__ int end_block;          // its group_end_block
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int b = t; b < num_blocks; b += blockDim.x) removed[b] = 0;
  __syncthreads();
  for (int block = 0; block < num_blocks; ++block) {
    const int start = block * kBlockBoxes;
    const int size = min(n - start, kBlockBoxes);
    if (warp == 0) {
      const int64_t first_row = static_cast<int64_t>(start) * num_blocks + block;
      const Word low = lane < size ? mask[first_row + int64_t(lane) * num_blocks] : 0;
      const Word high = lane + 32 < size ? mask[first_row + int64_t(lane + 32) * num_blocks] : 0;
      Word gone = removed[block];
      for (int i = 0; i < size; ++i) {  // size is warp-uniform: every lane shuffles
        const Word row_word = __shfl_sync(kFullWarp, i < 32 ? low : high, i & 31);
        if (!((gone >> i) & 1)) gone |= row_word;
      }
      const Word in_block = size == kBlockBoxes ? ~Word(0) : (Word(1) << size) - 1;
      const Word kept = ~gone & in_block;
      if (lane < size) keep[order[start + lane]] = (kept >> lane) & 1;
      if (lane + 32 < size) keep[order[start + lane + 32]] = (kept >> (lane + 32)) & 1;
      if (lane == 0) {
        kept_word = kept;
        end_block = group_end_block(sorted_labels, n, block, num_blocks);
      }
    }
    __syncthreads();
    const Word kept = kept_word;
    const int later = end_block - (block + 1);  // blocks after this one that share its labels
    if (kept != 0 && later > 0) {
      // (kept row i, later block j) pairs; consecutive threads read consecutive words of a row
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
    const dim3 grid(num_blocks, num_blocks);
    const auto launch = [&](auto dim) {
      suppression_mask_kernel<scalar_t, decltype(dim)::value><<<grid, kBlockBoxes, 0, stream>>>(
          sorted_boxes.data_ptr<scalar_t>(), label_data, n, num_blocks,
          static_cast<acc_t>(iou_threshold), mask_data);
    };
    boxes_.size(1) == 5 ? launch(std::integral_constant<int, 5>{})
                        : launch(std::integral_constant<int, 4>{});
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  greedy_scan_kernel<<<1, kScanThreads, num_blocks * sizeof(Word), stream>>>(
      mask_data, label_data, order.data_ptr<int64_t>(), n, num_blocks, keep.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return keep;
}

}  // namespace redet
