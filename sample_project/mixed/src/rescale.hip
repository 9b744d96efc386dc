// HIP relocatable device code: a kernel calling scaled() of scale.hip (only RDC links that).
#include "hip_min.h"

__device__ int scaled(int x);
__global__ void rescale_kernel(int *out) { out[threadIdx.x] = scaled(out[threadIdx.x]); }

void launch_rescale(int *out) { rescale_kernel<<<1, 8>>>(out); }
