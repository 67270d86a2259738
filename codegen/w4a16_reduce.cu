// codegen/w4a16_reduce.cu: the sum of w4a16_gemm.cu's K splits, plus the bias, in @T@.
#include "w4a16.cuh"

extern "C" __global__ void __launch_bounds__(256)
    @NAME@(const float* __restrict__ partial, const @T@* __restrict__ bias, @T@* __restrict__ y,
           int m, int n, int splits) {
  const size_t count = (size_t)m * n;
  for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < count; i += (size_t)gridDim.x * 256) {
    float sum = bias ? w4::Ty<@T@>::to_float(bias[i % n]) : 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[(size_t)s * count + i];
    y[i] = w4::Ty<@T@>::from_float(sum);
  }
}
