// Relocatable device code only: the kernel calls scaled(), defined in scale.hip (another object).
#include "kernels.h"

extern __device__ float scaled(float v);

__global__ void rescale(int n, float *x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    x[i] = scaled(x[i]);
}

void launch_rescale(int n, float *x, hipStream_t stream) {
  rescale<<<(n + 63) / 64, 64, 0, stream>>>(n, x);
}
