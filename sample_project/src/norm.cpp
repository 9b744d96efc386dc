// A second translation unit with its own target region: a reduction.
#include "sample.hpp"

double squared_norm(const complex *Y, std::size_t N) {
  double sum = 0.0;
#pragma omp target teams distribute parallel for reduction(+ : sum) map(to : Y[0 : N])
  for (std::size_t i = 0; i < N; ++i)
    sum += Y[i].real() * Y[i].real() + Y[i].imag() * Y[i].imag();
  return sum;
}
