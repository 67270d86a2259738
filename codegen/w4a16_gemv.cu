// codegen/w4a16_gemv.cu: Y = A @ W^T + bias for M <= 8 rows of A and an int4 weight in
// MatMulNBits' layout (codegen/w4a16.cuh): a 16-row tile of W a block, K split over its @WARPS@
// warps (@DEPTH@ chunks of weights in flight each) and over the @SPLIT@ blocks of a cluster.
#include "w4a16.cuh"

extern "C" __global__ void @CLUSTER@ __launch_bounds__(@WARPS@ * 32, @MIN_BLOCKS@)
    @NAME@(const @T@* __restrict__ a, const unsigned char* __restrict__ b,
           const @T@* __restrict__ scales, const unsigned char* __restrict__ zeros,
           const @T@* __restrict__ bias, @T@* __restrict__ y, int m, int n, int k) {
  KN_PDL_BEGIN();
  w4::gemv<@T@, @BLOCK@, @WARPS@, @DEPTH@, @SPLIT@>(a, b, scales, zeros, bias, y, m, n, k);
}
