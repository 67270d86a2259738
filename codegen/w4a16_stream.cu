// codegen/w4a16_stream.cu: Y = A @ W^T + bias for M <= @COLS@ rows of A and an int4 weight in
// MatMulNBits' layout on the CUDA cores (codegen/w4a16_stream.cuh): @ROWS@ rows of W a row group
// of @SPLIT@ warps (K split between them) with @UNROLL@ 16-byte loads of each in flight a lane
// (activations loaded with them: @AHEAD@), @WARPS@ warps a block; the first codes loaded before
// the wait for the kernel ahead: @EARLY@.
#include "w4a16_stream.cuh"

extern "C" __global__ void __launch_bounds__(@WARPS@ * 32, @MIN_BLOCKS@)
    @NAME@(const @T@* __restrict__ a, const unsigned char* __restrict__ b,
           const @T@* __restrict__ scales, const unsigned char* __restrict__ zeros,
           const @T@* __restrict__ bias, @T@* __restrict__ y, int m, int n, int k) {
  KN_PDL_OPEN(@EARLY@);
  w4::stream_gemv<@T@, @BLOCK@, @COLS@, @ROWS@, @UNROLL@, @WARPS@, @SPLIT@, @AHEAD@, @EARLY@>(
      a, b, scales, zeros, bias, y, m, n, k);
}
