// The OpenMP + HIP + CUDA program's host code (a plain host object).
#include <cstdio>

int omp_sum(int n);
void launch_plain(int *out);   // sample_project/mixed/src/plain.hip (plain HIP)
void launch_rescale(int *out); // sample_project/mixed/src/rescale.hip (HIP RDC, with scale.hip)
void launch_cuda_scale(float *x);
void launch_cuda_shift(float *x);
int hip_stub_check();
int cuda_stub_check();

int main() {
  int sum = omp_sum(10);
  std::printf("OpenMP target regions ran on an offload device: %s\n", sum == 55 ? "yes" : "no");
  launch_plain(nullptr);
  launch_rescale(nullptr);
  launch_cuda_scale(nullptr);
  launch_cuda_shift(nullptr);
  int hip_ok = hip_stub_check(), cuda_ok = cuda_stub_check();
  bool ok = sum == 55 && hip_ok && cuda_ok;
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
