// A stand-in for the CUDA runtime that checks: each kernel registered exactly once and launched exactly once
// (cuda_stub_check, called at the end of main), from fat binaries of NVIDIA's format.
#include <cstdio>
#include <cstring>

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { int magic, version; const void *data; void *unused; };

namespace {
struct Kernel { const void *stub; const char *name; int registered, launched; };
Kernel kernels[64];
int kernel_count, binaries, bad_binaries, unregistered_launches;
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
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].registered;
      return;
    }
  if (kernel_count < 64)
    kernels[kernel_count++] = {stub, name, 1, 0};
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
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].launched;
      return 0;
    }
  ++unregistered_launches;
  return 1;
}
}

int cuda_stub_check() {
  int ok = kernel_count > 0 && binaries > 0 && bad_binaries == 0 && unregistered_launches == 0;
  for (int i = 0; i < kernel_count; ++i) {
    std::printf("CUDA kernel %s: registered %d, launched %d\n", kernels[i].name, kernels[i].registered,
                kernels[i].launched);
    ok = ok && kernels[i].registered == 1 && kernels[i].launched == 1;
  }
  std::printf("CUDA fat binaries registered: %d\n", binaries);
  std::printf("CUDA kernels each registered once and launched once: %s\n", ok ? "yes" : "no");
  return ok;
}
