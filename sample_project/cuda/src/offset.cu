// CUDA relocatable device code: a device function that another object's kernel calls.
#include "cuda_min.h"

__device__ float offset_by(float x) { return x + 1.0f; }
