// A stand-in for the HIP runtime (as sample_project/hip/src/stub_runtime.cpp) that also checks: each
// kernel registered exactly once and launched exactly once (hip_stub_check, called at the end of main).
#include "hip_stub_runtime.h"  // the entry points all stand-ins share
#include "stub_kernels.h"      // the registration and launch counts

extern "C" {
void __hipRegisterFunction(void **, const void *stub, char *, const char *name, int, void *, void *, void *,
                           void *, int *) {
  std::printf("kernel %s\n", name);
  register_kernel(stub, name);
}
int hipLaunchKernel(const void *stub, dim3 grid, dim3 block, void **, unsigned long, void *) {
  if (const Kernel *kernel = launch_kernel(stub)) {
    std::printf("launch %s grid=%u block=%u\n", kernel->name, grid.x, block.x);
    return 0;
  }
  std::printf("launch of an unregistered kernel grid=%u block=%u\n", grid.x, block.x);
  return 1;
}
}

int hip_stub_check() {
  int ok = kernels_ok("HIP");
  std::printf("HIP kernels each registered once and launched once: %s\n", ok ? "yes" : "no");
  return ok;
}
