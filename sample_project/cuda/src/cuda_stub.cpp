// A stand-in for the CUDA runtime that checks: each kernel registered exactly once and launched exactly once
// (cuda_stub_check, called at the end of main), from fat binaries of NVIDIA's format.
#include <cstdio>
#include <cstring>

#include "stub_kernels.h"  // the registration and launch counts (sample_project/hip/include)

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { int magic, version; const void *data; void *unused; };

namespace {
int binaries, bad_binaries;
}  // namespace

extern "C" {
void **__cudaRegisterFatBinary(void *wrapper) {
  static void *handle;
  const FatbinWrapper *w = static_cast<const FatbinWrapper *>(wrapper);
  unsigned magic = 0;
  std::memcpy(&magic, w->data, sizeof magic);
  std::printf("CUDA fatbin wrapper magic=%08x fatbin magic=%08x\n", w->magic, magic);
  ++binaries;
  bad_binaries += w->magic != 0x466243b1 || magic != 0xBA55ED50u;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void **) {}
void __cudaUnregisterFatBinary(void **) {}
void __cudaRegisterFunction(void **, const void *stub, char *, const char *name, int, void *, void *, void *,
                            void *, int *) {
  register_kernel(stub, name);
}
void __cudaRegisterVar(void **, char *, char *, const char *name, int, unsigned long, int, int) {
  std::printf("CUDA variable %s\n", name);
}
unsigned __cudaPushCallConfiguration(dim3, dim3, unsigned long, void *) { return 0; }
int __cudaPopCallConfiguration(dim3 *grid, dim3 *block, unsigned long *shared, void **stream) {
  *grid = *block = {1, 1, 1}, *shared = 0, *stream = nullptr;
  return 0;
}
int cudaLaunchKernel(const void *stub, dim3, dim3, void **, unsigned long, void *) {
  return launch_kernel(stub) ? 0 : 1;
}
}

int cuda_stub_check() {
  bool ok = kernels_ok("CUDA") && binaries > 0 && bad_binaries == 0;
  std::printf("CUDA fat binaries registered: %d\n", binaries);
  std::printf("CUDA kernels each registered once and launched once: %s\n", ok ? "yes" : "no");
  return ok;
}
