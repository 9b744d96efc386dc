// What CUDA sources need without CUDA's headers: Clang 19 cannot parse CUDA 13's headers, so the tool
// compiles with -nocudainc and a source declares what it uses. With headers (Clang 22) this is empty.
#pragma once
#ifndef __global__
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef struct CUstream_st *cudaStream_t;
// The host side launches through these (the driver gives CUDA's version: the new launch API)...
extern "C" unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, unsigned long shared = 0, void *stream = 0);
extern "C" int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, unsigned long shared,
                                cudaStream_t stream);
// ...and the device side, which has no CUDA version, checks that the legacy one is declared.
extern "C" int cudaConfigureCall(dim3 grid, dim3 block, unsigned long shared = 0, cudaStream_t stream = 0);
#endif
