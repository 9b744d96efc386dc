// The sample's host-side entry points (one per source).
#ifndef SAMPLE_KERNELS_H
#define SAMPLE_KERNELS_H
#include "hip_min.h"

void launch_saxpy(int n, float a, const float *x, float *y, hipStream_t stream);
void launch_stencil(int n, const float *in, float *out, hipStream_t stream);
void launch_rescale(int n, float *x, hipStream_t stream);  // RDC only (src/rescale.hip)

#endif
