// The ZAXPY example of Clang's offloading design document, plus a `declare target` global.
#include "sample.hpp"

#include <cmath>
#include <cstdio>
#include <omp.h>

#pragma omp declare target
double result_scale = 1.0;
#pragma omp end declare target

void zaxpy(const complex *X, complex *Y, complex D, std::size_t N) {
#pragma omp target teams distribute parallel for map(to : X[0 : N]) map(tofrom : Y[0 : N])
  for (std::size_t i = 0; i < N; ++i)
    Y[i] = result_scale * (D * X[i] + Y[i]);
}

int main() {
  constexpr std::size_t N = 1024;
  static complex X[N], Y[N], expected[N];
  const complex D(2.0, -1.0);
  for (std::size_t i = 0; i < N; ++i) {
    X[i] = complex(double(i), 1.0);
    Y[i] = complex(1.0, double(i % 7));
  }

  int on_device = 0;
#pragma omp target map(from : on_device)
  on_device = !omp_is_initial_device();

  result_scale = 0.5;
#pragma omp target update to(result_scale)
  zaxpy(X, Y, D, N);

  double expected_norm = 0.0;
  for (std::size_t i = 0; i < N; ++i) {
    const complex x(double(i), 1.0), y(1.0, double(i % 7));
    expected[i] = 0.5 * (D * x + y);
    expected_norm += expected[i].real() * expected[i].real() + expected[i].imag() * expected[i].imag();
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < N; ++i)
    if (Y[i] != expected[i])
      ++wrong;
  const double norm = squared_norm(Y, N);
  const bool norm_ok = std::fabs(norm - expected_norm) <= 1e-9 * expected_norm;

  std::printf("offload devices: %d, target regions ran on an offload device: %s\n", omp_get_num_devices(),
              on_device ? "yes" : "no");
  std::printf("zaxpy: %zu of %zu elements wrong; Y[3] = (%g, %g)\n", wrong, N, Y[3].real(), Y[3].imag());
  std::printf("squared norm: %.6f (expected %.6f)\n", norm, expected_norm);
  const bool ok = on_device && wrong == 0 && norm_ok;
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
