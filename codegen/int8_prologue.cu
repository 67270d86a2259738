// codegen/int8_prologue.cu: int8 activations for cuBLASLt's IMMA GEMM (knopt/cuda/intgemm.py),
// and their row sums for the zero-point terms of codegen/int8_epilogue.cu.
#include "common.cuh"

// One block a row: out = x - 128 when flip (uint8 to int8), else x; rowsum[row] = sum of out.
// Either output may be null.
extern "C" __global__ void __launch_bounds__(256)
    @NAME@(const unsigned char* __restrict__ x, signed char* __restrict__ out,
           int* __restrict__ rowsum, int k, int flip) {
  KN_PDL_BEGIN();
  __shared__ int warp_sums[8];
  const size_t base = (size_t)blockIdx.x * k;
  int sum = 0;
  for (int j = threadIdx.x; j < k; j += 256) {
    const signed char v = (signed char)(flip ? x[base + j] ^ 0x80 : x[base + j]);
    if (out) out[base + j] = v;
    sum += v;
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0 && rowsum) {
    int total = 0;
    for (int w = 0; w < 8; ++w) total += warp_sums[w];
    rowsum[blockIdx.x] = total;
  }
}
