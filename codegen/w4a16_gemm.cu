// codegen/w4a16_gemm.cu: Y = A @ W^T + bias for any M and an int4 weight in MatMulNBits' layout
// (codegen/w4a16.cuh): 64 x 64 output tiles, K split over gridDim.z (then partial sums go to
// `partial`, [splits, M, N] float32, for w4a16_reduce.cu).
#include "w4a16.cuh"

extern "C" __global__ void __launch_bounds__(w4::GEMM_WARPS * 32)
    @NAME@(const @T@* __restrict__ a, const unsigned char* __restrict__ b,
           const @T@* __restrict__ scales, const unsigned char* __restrict__ zeros,
           const @T@* __restrict__ bias, @T@* __restrict__ y, float* __restrict__ partial, int m,
           int n, int k) {
  w4::gemm<@T@, @BLOCK@>(a, b, scales, zeros, bias, y, partial, m, n, k);
}
