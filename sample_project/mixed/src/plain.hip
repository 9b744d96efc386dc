// Plain (non-RDC) HIP: the object registers its own fat binary from its own constructor.
#include "hip_min.h"

__global__ void plain_kernel(int *out) { out[threadIdx.x] = threadIdx.x; }

void launch_plain(int *out) { plain_kernel<<<1, 4>>>(out); }
