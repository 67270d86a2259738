// codegen/w4a16_gemm.cu: Y = A @ W^T + bias for any M and an int4 weight in MatMulNBits' layout
// (codegen/w4a16.cuh): @WARPS@ x 16 rows of W by @BM@ rows of A a block (@DEPTH@ chunks of
// weights in flight a warp), K split over the @SPLIT@ blocks of a cluster.
#include "w4a16.cuh"

extern "C" __global__ void @CLUSTER@ __launch_bounds__(@WARPS@ * 32, @MIN_BLOCKS@)
    @NAME@(const @T@* __restrict__ a, const unsigned char* __restrict__ b,
           const @T@* __restrict__ scales, const unsigned char* __restrict__ zeros,
           const @T@* __restrict__ bias, @T@* __restrict__ y, int m, int n, int k) {
  KN_PDL_BEGIN();
  w4::gemm<@T@, @BLOCK@, @WARPS@, @BM@, @DEPTH@, @SPLIT@>(a, b, scales, zeros, bias, y, m, n, k);
}
