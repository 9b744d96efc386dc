// Shared declarations of the offload sample.
#pragma once
#include <complex>
#include <cstddef>

using complex = std::complex<double>;

// Scale applied to every ZAXPY result; a `declare target` global updated from the host.
#pragma omp declare target
extern double result_scale;
#pragma omp end declare target

void zaxpy(const complex *X, complex *Y, complex D, std::size_t N);
double squared_norm(const complex *Y, std::size_t N);
