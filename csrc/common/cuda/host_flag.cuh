// A 4-byte flag that a check kernel sets in pinned host memory and the host reads after one event
// wait: no device-to-host copy, no side stream. The kernel writes through the mapped pointer
// (device_word(), a plain store of 1, only when something is wrong), arm() records an event after
// it, and is_set() waits for that event alone. An op arms the flag, enqueues its main kernels and
// only then asks, so its one host synchronisation overlaps its own kernels (the GPU never waits
// for the host). While a CUDA graph is being captured no flag is used (capturing_cuda_graph()).
// Why not copy a device word back: the copy needs a pinned allocation, an event created and
// destroyed, and a side stream's wait, copy and record - host time comparable to a small op's
// whole GPU time. The pinned word and the event here come from a per-thread cache
// (host_flag.cu), so a call costs one event record.
#pragma once
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace redet {

// Whether the current stream is being captured into a CUDA graph. A host wait is illegal there,
// and a replay could not raise anyway, so the ops then enqueue no check and wait for nothing:
// their kernels' guards alone keep bad input inside the tensors (README: "Bad input, host waits
// and CUDA graphs").
inline bool capturing_cuda_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

struct HostFlagSlot;  // host_flag.cu

class HostFlag {
 public:
  explicit HostFlag(c10::DeviceIndex device);  // the word starts at 0
  ~HostFlag();  // waits for an armed event not yet waited for (error paths), frees the slot
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;

  int* device_word() const;
  void arm(cudaStream_t stream);  // after the kernels that may set the word
  // Waits for arm()'s event (honouring torch.cuda.set_sync_debug_mode) and reads the word.
  bool is_set();

 private:
  HostFlagSlot* slot_;
  bool armed_ = false;
  bool waited_ = false;
};

}  // namespace redet
