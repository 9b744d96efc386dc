// hip_min.h: the few HIP runtime declarations the sample's kernels and launches need.
//
// The sample compiles with -nogpulib -nogpuinc (its SConstruct sets them: it must build where no ROCm is
// installed), so Clang's HIP wrapper headers (which include ROCm's hip_runtime.h) are left out. What
// Clang 19 itself requires is small:
//   * the attribute spellings (__global__, __device__, ...), normally from the HIP headers;
//   * for `kernel<<<grid, block, shmem, stream>>>(...)`: a declaration of __hipPushCallConfiguration
//     (called at the launch site) and of hipLaunchKernel (called by the host-side kernel stub, with
//     -fhip-new-launch-api, which the driver always passes); Clang declares __hipPopCallConfiguration
//     itself. A missing one is "use of undeclared identifier '__hipPushCallConfiguration'" or
//     "Can't find declaration for hipLaunchKernel";
//   * dim3 (the type of the launch configuration), hipStream_t and hipError_t.
// Registration (__hipRegisterFatBinary, __hipRegisterFunction, ...) is declared by Clang's code
// generation itself. The index variables below follow Clang's __clang_cuda_builtin_vars.h.
#ifndef HIP_MIN_H
#define HIP_MIN_H

#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __launch_bounds__(...) __attribute__((amdgpu_flat_work_group_size(1, __VA_ARGS__)))

typedef __SIZE_TYPE__ size_t;

struct dim3 {
  unsigned x, y, z;
  constexpr __host__ __device__ dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct ihipStream_t *hipStream_t;
typedef enum hipError_t { hipSuccess = 0 } hipError_t;

extern "C" {
unsigned __hipPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem = 0, hipStream_t stream = 0);
hipError_t hipLaunchKernel(const void *function, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                           hipStream_t stream);
}

#define hipLaunchKernelGGL(kernel, grid, block, sharedMem, stream, ...) \
  kernel<<<(grid), (block), (sharedMem), (stream)>>>(__VA_ARGS__)

#define __HIP_MIN_INDEX(Name, X, Y, Z)                                                               \
  struct __hip_min_##Name##_t {                                                                      \
    static inline __device__ __attribute__((always_inline)) unsigned __x() { return X; }            \
    static inline __device__ __attribute__((always_inline)) unsigned __y() { return Y; }            \
    static inline __device__ __attribute__((always_inline)) unsigned __z() { return Z; }            \
    __declspec(property(get = __x)) unsigned x;                                                      \
    __declspec(property(get = __y)) unsigned y;                                                      \
    __declspec(property(get = __z)) unsigned z;                                                      \
  };                                                                                                 \
  extern const __device__ __attribute__((weak)) __hip_min_##Name##_t Name;

__HIP_MIN_INDEX(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                __builtin_amdgcn_workitem_id_z())
__HIP_MIN_INDEX(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                __builtin_amdgcn_workgroup_id_z())
__HIP_MIN_INDEX(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
                __builtin_amdgcn_workgroup_size_z())
#undef __HIP_MIN_INDEX

static inline __device__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

#endif  // HIP_MIN_H
