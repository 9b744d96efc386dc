// A stand-in for the HIP runtime (as sample_project/hip/src/stub_runtime.cpp) that also checks: each
// kernel registered exactly once and launched exactly once (hip_stub_check, called at the end of main).
#include <cstdio>
#include <cstring>

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { unsigned magic, version; const char *binary; void *unused; };

namespace {
struct Kernel { const void *stub; const char *name; int registered, launched; };
Kernel kernels[64];
int kernel_count, unregistered_launches;
}  // namespace

extern "C" {
void **__hipRegisterFatBinary(const FatbinWrapper *w) {
  static void *handle;
  unsigned long long entries = 0;
  if (std::memcmp(w->binary, "__CLANG_OFFLOAD_BUNDLE__", 24) == 0)
    std::memcpy(&entries, w->binary + 24, sizeof entries);
  std::printf("fatbin magic=%08x version=%u %.24s entries=%llu\n", w->magic, w->version, w->binary, entries);
  return &handle;
}
void __hipRegisterFunction(void **, const void *stub, char *, const char *name, int, void *, void *, void *,
                           void *, int *) {
  std::printf("kernel %s\n", name);
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].registered;
      return;
    }
  if (kernel_count < 64)
    kernels[kernel_count++] = {stub, name, 1, 0};
}
void __hipRegisterVar(void **, void *, char *, const char *name, int, unsigned long, int, int) {
  std::printf("variable %s\n", name);
}
void __hipRegisterSurface(void **, void *, char *, const char *name, int, int) { std::printf("surface %s\n", name); }
void __hipRegisterTexture(void **, void *, char *, const char *name, int, int, int) {
  std::printf("texture %s\n", name);
}
void __hipUnregisterFatBinary(void **) {}
static dim3 pushed_grid, pushed_block;
unsigned __hipPushCallConfiguration(dim3 grid, dim3 block, unsigned long, void *) {
  pushed_grid = grid, pushed_block = block;
  return 0;
}
int __hipPopCallConfiguration(dim3 *grid, dim3 *block, unsigned long *shared, void **stream) {
  *grid = pushed_grid, *block = pushed_block, *shared = 0, *stream = nullptr;
  return 0;
}
int hipLaunchKernel(const void *stub, dim3 grid, dim3 block, void **, unsigned long, void *) {
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].launched;
      std::printf("launch %s grid=%u block=%u\n", kernels[i].name, grid.x, block.x);
      return 0;
    }
  ++unregistered_launches;
  std::printf("launch of an unregistered kernel grid=%u block=%u\n", grid.x, block.x);
  return 1;
}
}

int hip_stub_check() {
  int ok = kernel_count > 0 && unregistered_launches == 0;
  for (int i = 0; i < kernel_count; ++i) {
    std::printf("HIP kernel %s: registered %d, launched %d\n", kernels[i].name, kernels[i].registered,
                kernels[i].launched);
    ok = ok && kernels[i].registered == 1 && kernels[i].launched == 1;
  }
  std::printf("HIP kernels each registered once and launched once: %s\n", ok ? "yes" : "no");
  return ok;
}
