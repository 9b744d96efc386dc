// A stand-in for the HIP runtime (libamdhip64), for a machine without ROCm or GPU: the entry points the
// objects and the registration code call, printing what they get, so the program shows which fat
// binaries, kernels and variables it registers and which kernels it launches. Nothing runs on a GPU.
#include "hip_stub_runtime.h"  // the entry points all stand-ins share

extern "C" {
void __hipRegisterFunction(void **, const void *, char *, const char *name, int, void *, void *, void *, void *,
                           int *) { std::printf("kernel %s\n", name); }
int hipLaunchKernel(const void *, dim3 grid, dim3 block, void **, unsigned long, void *) {
  std::printf("launch grid=%u block=%u\n", grid.x, block.x);
  return 0;
}
}
