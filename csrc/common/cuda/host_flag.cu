// HostFlag (common/cuda/host_flag.cuh): pinned words and events cached per thread and device.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <memory>
#include <vector>

#include "common/cuda/host_flag.cuh"

namespace redet {

struct HostFlagSlot {
  c10::DeviceIndex device;
  volatile int* host_word = nullptr;  // written by kernels, so never cached by the compiler
  int* device_word = nullptr;
  cudaEvent_t event = nullptr;
  bool in_use = false;

  explicit HostFlagSlot(c10::DeviceIndex d) : device(d) {
    int* host = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(int),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
    host_word = host;
    C10_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_word), host, 0));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  ~HostFlagSlot() {  // at thread exit; errors ignored (the CUDA runtime may already be unloading)
    if (event != nullptr) (void)cudaEventDestroy(event);
    if (host_word != nullptr) (void)cudaFreeHost(const_cast<int*>(host_word));
    (void)cudaGetLastError();
  }
};

namespace {

// A thread's slots; more than one per device only when checks nest (an op checking inside
// another's window), which no op does today.
HostFlagSlot* acquire_slot(c10::DeviceIndex device) {
  thread_local std::vector<std::unique_ptr<HostFlagSlot>> slots;
  for (auto& slot : slots) {
    if (slot->device == device && !slot->in_use) {
      slot->in_use = true;
      return slot.get();
    }
  }
  c10::cuda::CUDAGuard guard(device);  // the event belongs to this device
  slots.push_back(std::make_unique<HostFlagSlot>(device));
  slots.back()->in_use = true;
  return slots.back().get();
}

}  // namespace

HostFlag::HostFlag(c10::DeviceIndex device) : slot_(acquire_slot(device)) { *slot_->host_word = 0; }

HostFlag::~HostFlag() {
  if (armed_ && !waited_) (void)cudaEventSynchronize(slot_->event);  // a kernel may still write
  slot_->in_use = false;
}

int* HostFlag::device_word() const { return slot_->device_word; }

void HostFlag::arm(cudaStream_t stream) {
  C10_CUDA_CHECK(cudaEventRecord(slot_->event, stream));
  armed_ = true;
}

bool HostFlag::is_set() {
  TORCH_INTERNAL_ASSERT(armed_, "HostFlag::is_set() before arm()");
  if (c10::cuda::warning_state().get_sync_debug_mode() != c10::cuda::SyncDebugMode::L_DISABLED) {
    c10::cuda::warn_or_error_on_sync();
  }
  C10_CUDA_CHECK(cudaEventSynchronize(slot_->event));
  waited_ = true;
  return *slot_->host_word != 0;
}

}  // namespace redet
