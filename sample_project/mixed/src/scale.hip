// HIP relocatable device code: a device function and variable that another object's kernel uses.
#include "hip_min.h"

__device__ int scale_factor = 3;
__device__ int scaled(int x) { return x * scale_factor; }
