// OpenMP: a target region (runs on the x86_64 "device" here, OMP_TARGET_OFFLOAD=MANDATORY).
#include <omp.h>

int omp_sum(int n) {
  int sum = 0, on_host = 1;
#pragma omp target map(tofrom : sum, on_host)
  {
    on_host = omp_is_initial_device();
    for (int i = 1; i <= n; ++i)
      sum += i;
  }
  return on_host ? -sum : sum;
}
