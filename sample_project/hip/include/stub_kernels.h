// stub_kernels.h: how the checking stand-in runtimes (mixed/src/hip_stub.cpp, cuda/src/cuda_stub.cpp) count
// each kernel's registrations and launches, to check that each is registered once and launched once.
// Include it in the stand-in's one source: each gets its own table.
#ifndef STUB_KERNELS_H
#define STUB_KERNELS_H
#include <cstdio>

namespace {
struct Kernel { const void *stub; const char *name; int registered, launched; };
Kernel kernels[64];
int kernel_count, unregistered_launches;

void register_kernel(const void *stub, const char *name) {
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].registered;
      return;
    }
  if (kernel_count < 64)
    kernels[kernel_count++] = {stub, name, 1, 0};
}

// The kernel whose host stub is `stub`, its launch counted; nullptr for an unregistered kernel (counted too).
const Kernel *launch_kernel(const void *stub) {
  for (int i = 0; i < kernel_count; ++i)
    if (kernels[i].stub == stub) {
      ++kernels[i].launched;
      return &kernels[i];
    }
  ++unregistered_launches;
  return nullptr;
}

// Prints each kernel's counts ("<model> kernel <name>: registered 1, launched 1"); whether some kernel was
// registered, each once and launched once, and no unregistered kernel launched.
bool kernels_ok(const char *model) {
  bool ok = kernel_count > 0 && unregistered_launches == 0;
  for (int i = 0; i < kernel_count; ++i) {
    std::printf("%s kernel %s: registered %d, launched %d\n", model, kernels[i].name, kernels[i].registered,
                kernels[i].launched);
    ok = ok && kernels[i].registered == 1 && kernels[i].launched == 1;
  }
  return ok;
}
}  // namespace
#endif  // STUB_KERNELS_H
