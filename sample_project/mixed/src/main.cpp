// The heterogeneous program's host code (a plain host object): OpenMP target regions and HIP launches.
#include <cstdio>

int omp_sum(int n);
int omp_offset(int x);
void launch_plain(int *out);
void launch_rescale(int *out);
void launch_lib(int *out);
int hip_stub_check();

int main() {
  int sum = omp_sum(10), offset = omp_offset(1);
  std::printf("OpenMP target regions ran on an offload device: %s\n", sum == 55 && offset == 101 ? "yes" : "no");
  launch_plain(nullptr);
  launch_rescale(nullptr);
  launch_lib(nullptr);
  int hip_ok = hip_stub_check();
  bool ok = sum == 55 && offset == 101 && hip_ok;
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
