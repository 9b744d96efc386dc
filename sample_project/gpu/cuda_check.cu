// CUDA check for a real GPU, on the real CUDA runtime: a kernel of our own and a CUB reduction
// (cub::DeviceReduce::Sum), whose results the host checks. Prints PASS or FAIL.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cub/device/device_reduce.cuh>
#include <cuda_runtime.h>

#define STR2(x) #x
#define STR(x) STR2(x)

__global__ void axpy(long long n, long long a, const long long *x, long long *y) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = a * x[i] + y[i];
}

// Each CUDA call: report a failure by name and give up (a kernel the runtime cannot find says so here).
static bool check(cudaError_t status, const char *what) {
  if (status == cudaSuccess)
    return true;
  std::printf("%s: %s (%s)\n", what, cudaGetErrorName(status), cudaGetErrorString(status));
  std::printf("FAIL\n");
  return false;
}
#define CHECK(call) \
  do { \
    if (!check((call), #call)) \
      return 1; \
  } while (0)

int main() {
  const long long n = std::getenv("GPU_CHECK_N") ? std::atoll(std::getenv("GPU_CHECK_N")) : (1LL << 24);
  int runtime = 0, driver = 0, devices = 0, device = 0;
  CHECK(cudaRuntimeGetVersion(&runtime));
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaGetDeviceCount(&devices));
  CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("CUDA runtime %d, driver %d; %d device(s); device %d: %s, compute capability %d.%d;"
              " built for __CUDA_ARCH_LIST__=%s\n",
              runtime, driver, devices, device, prop.name, prop.major, prop.minor, STR(__CUDA_ARCH_LIST__));

  std::vector<long long> x(n), y(n);
  for (long long i = 0; i < n; ++i) {
    x[i] = i % 1000;
    y[i] = i % 7;
  }
  long long *dx = nullptr, *dy = nullptr, *dsum = nullptr;
  CHECK(cudaMalloc(&dx, n * sizeof *dx));
  CHECK(cudaMalloc(&dy, n * sizeof *dy));
  CHECK(cudaMalloc(&dsum, sizeof *dsum));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof *dx, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), n * sizeof *dy, cudaMemcpyHostToDevice));

  // Our own kernel, timed with events.
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  axpy<<<1024, 256>>>(n, 3, dx, dy);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  std::vector<long long> result(n);
  CHECK(cudaMemcpy(result.data(), dy, n * sizeof *dy, cudaMemcpyDeviceToHost));
  long long wrong = 0, expected_sum = 0;
  for (long long i = 0; i < n; ++i) {
    long long expected = 3 * (i % 1000) + i % 7;
    wrong += result[i] != expected;
    expected_sum += expected;
  }
  std::printf("axpy kernel: n=%lld, %lld wrong; y[12345 %% n]=%lld; %.3f ms\n", n, wrong, result[12345 % n], ms);

  // CUB: size the temporary storage, then reduce (its kernels are templates instantiated in this source).
  size_t bytes = 0;
  CHECK(cub::DeviceReduce::Sum(nullptr, bytes, dy, dsum, n));
  void *temp = nullptr;
  CHECK(cudaMalloc(&temp, bytes));
  CHECK(cub::DeviceReduce::Sum(temp, bytes, dy, dsum, n));
  CHECK(cudaGetLastError());
  long long sum = 0;
  CHECK(cudaMemcpy(&sum, dsum, sizeof sum, cudaMemcpyDeviceToHost));
  std::printf("cub::DeviceReduce::Sum: %lld (expected %lld), %zu bytes of temporary storage\n", sum, expected_sum,
              bytes);

  CHECK(cudaFree(temp));
  CHECK(cudaFree(dsum));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(dx));
  const bool ok = wrong == 0 && sum == expected_sum;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
