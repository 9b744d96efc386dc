// hip_stub_runtime.h: the HIP runtime entry points every stand-in runtime of the samples implements alike
// (hip/src/stub_runtime.cpp, mixed/src/hip_stub.cpp): registering fat binaries, variables, surfaces and
// textures (printing what they get) and the launch configuration. Include it in the one source of a stand-in
// runtime, which defines the two entry points that differ: __hipRegisterFunction and hipLaunchKernel.
// (Not hip_min.h: that one declares the HIP API for the sources that use it, this defines the runtime.)
#ifndef HIP_STUB_RUNTIME_H
#define HIP_STUB_RUNTIME_H
#include <cstdio>
#include <cstring>

struct dim3 { unsigned x, y, z; };
struct FatbinWrapper { unsigned magic, version; const char *binary; void *unused; };

extern "C" {
void **__hipRegisterFatBinary(const FatbinWrapper *w) {
  static void *handle;
  unsigned long long entries = 0;
  if (std::memcmp(w->binary, "__CLANG_OFFLOAD_BUNDLE__", 24) == 0)
    std::memcpy(&entries, w->binary + 24, sizeof entries);
  std::printf("fatbin magic=%08x version=%u %.24s entries=%llu\n", w->magic, w->version, w->binary, entries);
  return &handle;
}
void __hipRegisterVar(void **, void *, char *, const char *name, int, unsigned long, int, int) {
  std::printf("variable %s\n", name);
}
// The linker wrapper's registration code (RDC) also registers surfaces and textures.
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
}
#endif  // HIP_STUB_RUNTIME_H
