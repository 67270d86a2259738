// codegen/gemv.cu: Y = alpha * A @ W + bias + residual for M <= @COLS@ rows of A and a constant
// half-precision weight W [K, N] (codegen/gemv.cuh): K shared by the @SPLIT@ blocks of a
// cluster; the first chunks of W loaded before the wait for the kernel ahead: @EARLY@.
#include "gemv.cuh"

extern "C" __global__ void @CLUSTER@ __launch_bounds__(256, @MIN_BLOCKS@)
    @NAME@(const @T@* __restrict__ a, const @T@* __restrict__ w, const @T@* __restrict__ bias,
           const @T@* __restrict__ residual, @T@* __restrict__ y, int m, int n, int k, int lda,
           float alpha) {
  KN_PDL_OPEN(@EARLY@);
  knv::gemv<@T@, @COLS@, @SPLIT@, @EARLY@>(a, w, bias, residual, y, m, n, k, lda, alpha);
}
