// Shared by CPU (.cpp) and CUDA (.cu) code: one definition of the geometry, compiled for both.
#pragma once

#if defined(__CUDACC__)
#define REDET_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define REDET_HOST_DEVICE inline
#endif
