// codegen/w4a16_dequantize.cu: W[n, k] in @T@ (row-major, K a row) from an int4 weight in
// MatMulNBits' layout (codegen/w4a16.cuh), for a library GEMM at large M.
#include "w4a16.cuh"

extern "C" __global__ void __launch_bounds__(256)
    @NAME@(const unsigned char* __restrict__ b, const @T@* __restrict__ scales,
           const unsigned char* __restrict__ zeros, @T@* __restrict__ w, int n, int k) {
  KN_PDL_BEGIN();
  w4::dequantize<@T@, @BLOCK@>(b, scales, zeros, w, n, k);
}
