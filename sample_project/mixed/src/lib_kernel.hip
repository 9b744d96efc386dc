// HIP relocatable device code, in the static library with an OpenMP object.
#include "hip_min.h"

__global__ void lib_kernel(int *out) { out[0] = 42; }

void launch_lib(int *out) { lib_kernel<<<2, 1>>>(out); }
