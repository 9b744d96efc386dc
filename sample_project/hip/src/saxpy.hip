// y = a * x + y, launched with the triple-chevron syntax.
#include "kernels.h"

__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i] + y[i];
}

void launch_saxpy(int n, float a, const float *x, float *y, hipStream_t stream) {
  saxpy<<<(n + 255) / 256, 256, 0, stream>>>(n, a, x, y);
}
