// A few bytes a check kernel wrote on the GPU, read back without stalling the GPU: start() copies
// them into pinned memory once that kernel is done, on a side stream (so the op's next kernels do
// not wait behind the copy's round trip to the host: ~7 us per call measured on an H200), and
// marks the copy with an event; the op then enqueues its main kernels and only afterwards
// wait()s, for that event alone. So the op's one host synchronisation overlaps its own kernels
// instead of leaving the GPU idle while the host wakes up and enqueues them; pinned memory
// (torch's cached host allocator, as .item() uses) avoids the driver's slower staged copy into
// pageable memory. The device bytes must stay allocated until wait() (or the destructor) returns.
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace redet {

class AsyncReadback {
 public:
  AsyncReadback() = default;
  AsyncReadback(const AsyncReadback&) = delete;
  AsyncReadback& operator=(const AsyncReadback&) = delete;
  ~AsyncReadback() {
    if (copied_ == nullptr) return;
    if (!waited_) cudaEventSynchronize(copied_);  // (an error path: the copy must not outlive host_)
    cudaEventDestroy(copied_);
  }

  void start(const void* device, int64_t bytes, cudaStream_t stream) {
    host_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(copied_, stream));  // the check kernel is done
    const cudaStream_t side = c10::cuda::getStreamFromPool().stream();
    C10_CUDA_CHECK(cudaStreamWaitEvent(side, copied_, 0));
    C10_CUDA_CHECK(cudaMemcpyAsync(host_.data_ptr(), device, bytes, cudaMemcpyDeviceToHost, side));
    C10_CUDA_CHECK(cudaEventRecord(copied_, side));  // (the wait above keeps its earlier record)
  }

  bool started() const { return copied_ != nullptr; }

  // The host copy, once the device-to-host copy has finished (honours
  // torch.cuda.set_sync_debug_mode, as any host synchronisation should).
  const void* wait() {
    if (c10::cuda::warning_state().get_sync_debug_mode() != c10::cuda::SyncDebugMode::L_DISABLED) {
      c10::cuda::warn_or_error_on_sync();
    }
    C10_CUDA_CHECK(cudaEventSynchronize(copied_));
    waited_ = true;
    return host_.data_ptr();
  }

 private:
  at::Tensor host_;
  cudaEvent_t copied_ = nullptr;
  bool waited_ = false;
};

}  // namespace redet
