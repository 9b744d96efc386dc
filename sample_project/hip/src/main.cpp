// The sample program's host code (scons program=1): launches each kernel once. Compiled as host-only
// HIP, as it includes the HIP declarations; SAMPLE_RDC adds the kernel that only RDC can link.
#include "kernels.h"

int main() {
  launch_saxpy(1000, 2.0f, nullptr, nullptr, nullptr);
  launch_stencil(1000, nullptr, nullptr, nullptr);
#ifdef SAMPLE_RDC
  launch_rescale(1000, nullptr, nullptr);
#endif
}
