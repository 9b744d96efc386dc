// Plain (non-RDC) CUDA: the object registers its own fat binary (.nv_fatbin) from its own constructor.
#include "cuda_min.h"

__global__ void cuda_scale(float *x, float a) { x[0] *= a; }

void launch_cuda_scale(float *x) { cuda_scale<<<1, 1>>>(x, 2.0f); }
