// codegen/attention_combine.cu: merges the partial results of attention split over key ranges
// (attention_mma.cu with splits > 1): for each output element, with per-split running maxima
// m_i, sums l_i and unnormalized outputs o_i, out = sum_i w_i o_i / sum_i w_i l_i where
// w_i = exp(m_i - max_i m_i). A row whose every key was -inf gives 0 / 0 = NaN, as the CPU does.
//
// Arguments: out [..., s_len, E]; ws, the partials ([splits, heads, s_len, EP] outputs, then
// [splits, heads, s_len, 2] maxima and sums); s_len; n1, n2 (sizes of the 2nd and 3rd leading
// axes); out's strides o0 o1 o2 (leading axes), os (rows), oe (columns); heads; splits.
// Grid: ceil(heads * s_len * E / 256) blocks of 256 threads, one output element each.
#include "attention.cuh"
extern "C" __global__ void __launch_bounds__(256) @NAME@(
    @ELEM@* __restrict__ out, const float* __restrict__ ws, const int s_len, const int n1,
    const int n2, const @INDEX@ o0, const @INDEX@ o1, const @INDEX@ o2, const @INDEX@ os,
    const @INDEX@ oe, const int heads, const int splits) {
  using namespace kn::attn;
  typedef @INDEX@ idx_t;
  constexpr int E = @E@;
  constexpr int EP = (E + 15) / 16 * 16;
  const idx_t index = (idx_t)blockIdx.x * 256 + threadIdx.x;
  const idx_t rows = (idx_t)heads * s_len;
  if (index >= rows * E) return;
  const int e = (int)(index % E);
  const idx_t part = index / E;  // head * s_len + row
  const int row = (int)(part % s_len);
  const idx_t head = part / s_len;
  const float* ws_ml = ws + (idx_t)splits * rows * EP;
  float overall = -KN_INF_F;
  for (int i = 0; i < splits; ++i) overall = fmaxf(overall, ws_ml[(i * rows + part) * 2]);
  float total = 0.0f;
  float o = 0.0f;
  for (int i = 0; i < splits; ++i) {
    const float w = rescale(ws_ml[(i * rows + part) * 2], overall);
    total += w * ws_ml[(i * rows + part) * 2 + 1];
    o += w * ws[(i * rows + part) * EP + e];
  }
  const idx_t ob = head_offset(head, n1, n2, o0, o1, o2);
  out[ob + row * os + e * oe] = kn::cvt<@ELEM@>(o / total);
}
