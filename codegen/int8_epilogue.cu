// codegen/int8_epilogue.cu: what an int8 GEMM (int32 accumulation, knopt/cuda/intgemm.py) needs
// around it that cuBLASLt cannot express: zero points, per-row and per-column scales together,
// round-half-even requantization with saturation, bias and activation.
//
// cuBLASLt multiplies signed int8 only. For y = sum_k (a - za)(w - zw):
//   int8_prologue.cu turns uint8 activations into int8 (a - 128: flip the top bit; the zero
//     point moves by 128 too) and/or sums each row of the int8 activations;
//   this kernel adds col_offset[n] (made once on the host from the constant weights:
//     K za zw[n] - za sum_k w[n, k]) and subtracts zw[n] * rowsum[m], then scales.
// Integer parts are exact (int32, as the accumulator). The float parts run in a fixed order,
// each step rounded once (no contraction into FMAs): float(acc) * scale * row_scale[m] *
// col_scale[n]; requantizing then rounds half to even (cvt.rni), clamps to
// [qmin - zero_point, qmax - zero_point] and adds the zero point, as onnxruntime's
// MlasRequantizeOutput does with one multiplier per channel (pass it as col_scale, scale = 1).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
    @NAME@(const int* __restrict__ acc, int m, int n, const int* __restrict__ col_offset,
           const int* __restrict__ row_sum, const int* __restrict__ w_zero,
           const float* __restrict__ row_scale, const float* __restrict__ col_scale, float scale,
           const float* __restrict__ bias, int zero_point, int qmin, int qmax,
           @OUT_T@* __restrict__ y) {
  KN_PDL_BEGIN();
  constexpr bool REQUANTIZE = @REQUANTIZE@;  // else dequantize to @OUT_T@
  constexpr int ACTIVATION = @ACTIVATION@;   // 0: none, 1: relu (dequantize only)
  const size_t count = (size_t)m * n;
  for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < count; i += (size_t)gridDim.x * 256) {
    const int row = (int)(i / n), col = (int)(i % n);
    int v = acc[i];
    if (col_offset) v += col_offset[col];
    if (row_sum && w_zero) v -= w_zero[col] * row_sum[row];
    float f = __fmul_rn((float)v, scale);
    if (row_scale) f = __fmul_rn(f, row_scale[row]);
    if (col_scale) f = __fmul_rn(f, col_scale[col]);
    if constexpr (REQUANTIZE) {
      const int q = min(max(__float2int_rn(f), qmin - zero_point), qmax - zero_point);
      y[i] = (@OUT_T@)(q + zero_point);
    } else {
      if (bias) f = __fadd_rn(f, bias[col]);
      if constexpr (ACTIVATION == 1) f = fmaxf(f, 0.0f);
      y[i] = kn::Cvt<@OUT_T@, float>::run(f);
    }
  }
}
