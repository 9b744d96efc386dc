// Relocatable device code only (scons rdc=1 program=1): a device function and a device variable that a
// kernel of another source (rescale.hip) uses; the program's per-target device link resolves them.
#include "hip_min.h"

__device__ float scale_factor = 3.0f;

__device__ float scaled(float v) { return scale_factor * v; }
