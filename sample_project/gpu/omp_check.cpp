// OpenMP offload check for a real GPU: target regions (SPMD and generic mode, a reduction, a declare-target
// global and function) whose results the host checks. Run with OMP_TARGET_OFFLOAD=MANDATORY, so an image the
// runtime does not load stops the program instead of falling back to the host. Prints PASS or FAIL.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <omp.h>
#include <vector>

// Which kind of device ran a target region: each device compile defines its own architecture macro.
#if defined(__NVPTX__)
#define DEVICE_KIND 1
#elif defined(__AMDGCN__)
#define DEVICE_KIND 2
#else
#define DEVICE_KIND 0
#endif
static const char *kind_name(int kind) { return kind == 1 ? "nvptx" : kind == 2 ? "amdgpu" : "host/x86_64"; }

#pragma omp declare target
double scale = 1.0;
// A device function the generic-mode region calls (links against the OpenMP device runtime's state).
static double polynomial(double x) { return (2.0 * x - 1.0) * x + 0.5; }
#pragma omp end declare target

int main() {
  const long n = std::getenv("GPU_CHECK_N") ? std::atol(std::getenv("GPU_CHECK_N")) : (1L << 24);
  std::vector<double> x(n), y(n);
  for (long i = 0; i < n; ++i) {
    x[i] = double(i % 1000) * 0.25;
    y[i] = double(i % 7);
  }
  double *xp = x.data(), *yp = y.data();
  int ok = 1;

  // 1. Where do target regions run? (generic mode: a plain target region)
  int initial = 1, kind = -1, teams = 0, threads = 0;
#pragma omp target map(from : initial, kind)
  {
    initial = omp_is_initial_device();
    kind = DEVICE_KIND;
  }
#pragma omp target teams map(from : teams, threads)
  {
#pragma omp parallel
    if (omp_get_team_num() == 0 && omp_get_thread_num() == 0) {
      teams = omp_get_num_teams();
      threads = omp_get_num_threads();
    }
  }
  std::printf("offload devices: %d (default %d); target region on the initial device: %s; device kind: %s;"
              " teams=%d threads/team=%d\n",
              omp_get_num_devices(), omp_get_default_device(), initial ? "yes" : "no", kind_name(kind), teams,
              threads);
  ok &= !initial && omp_get_num_devices() > 0;

  // 2. daxpy with a declare-target global updated from the host (SPMD: teams distribute parallel for).
  scale = 0.5;
#pragma omp target update to(scale)
  const double a = 3.0;
  auto start = std::chrono::steady_clock::now();
#pragma omp target teams distribute parallel for map(to : xp[0 : n]) map(tofrom : yp[0 : n])
  for (long i = 0; i < n; ++i)
    yp[i] = scale * (a * xp[i] + yp[i]);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long wrong = 0;
  for (long i = 0; i < n; ++i)
    wrong += yp[i] != 0.5 * (a * double(i % 1000) * 0.25 + double(i % 7));
  std::printf("daxpy: n=%ld, %ld wrong; y[12345 %% n]=%g (expected %g); %.3f ms with transfers\n", n, wrong,
              y[12345 % n], 0.5 * (a * double(12345 % n % 1000) * 0.25 + double(12345 % n % 7)), seconds * 1e3);
  ok &= wrong == 0;

  // 3. A reduction over the result (exact: every term is a multiple of 1/8 well inside double's range).
  double sum = 0.0, expected = 0.0;
#pragma omp target teams distribute parallel for reduction(+ : sum) map(to : yp[0 : n])
  for (long i = 0; i < n; ++i)
    sum += yp[i];
  for (long i = 0; i < n; ++i)
    expected += y[i];
  std::printf("reduction: sum=%.3f (expected %.3f)\n", sum, expected);
  ok &= sum == expected;

  // 4. Generic mode with a device function call and a serial loop inside the region.
  const long m = 1000;
  double poly = 0.0;
#pragma omp target map(tofrom : poly)
  for (long i = 0; i < m; ++i)
    poly += polynomial(double(i) / m);
  double poly_expected = 0.0;
  for (long i = 0; i < m; ++i)
    poly_expected += (2.0 * (double(i) / m) - 1.0) * (double(i) / m) + 0.5;
  std::printf("generic region: %.9f (expected %.9f)\n", poly, poly_expected);
  ok &= std::fabs(poly - poly_expected) <= 1e-9 * std::fabs(poly_expected);

  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
