// codegen/attention.cu: flash attention in f32 arithmetic (exact path; any float dtype and head
// size up to 256), softmax(q k^T * scale + bias) v without materializing the scores. A block
// takes BM = 16 * RI query rows of one head and walks the keys in tiles of BN, keeping a running
// max and sum per row (online softmax). 128 threads as 16 x 8: thread (ty, tx) owns rows
// ty + 16 i and, per key tile, columns tx + 8 j; for the output, value columns tx + 8 l. Tiles
// of q, k, v and the probabilities sit in shared memory as float.
//
// Arguments (sizes and strides are run-time values: one compiled kernel serves every length):
//   out, q, k, v, bias  [..., s_len, E], [..., s_len, D], [..., t_len, D], [..., t_len, E],
//                       [..., s_len, t_len] (bias is not read when HAS_BIAS is false)
//   scale               the factor of q k^T
//   s_len, t_len        query and key counts
//   n1, n2              sizes of the 2nd and 3rd of three leading (head) axes
//   q0 q1 q2 qs qd      q's strides: three leading axes, rows, columns (in elements); then the
//   k0 .. kd, v0 .. ve, b0 .. bt, o0 .. oe   same for k, v, bias and out
// Grid: heads * ceil(s_len / BM) blocks of 128 threads.
#include "attention.cuh"
extern "C" __global__ void __launch_bounds__(128) @NAME@(
    @ELEM@* __restrict__ out, const @ELEM@* __restrict__ q, const @ELEM@* __restrict__ k,
    const @ELEM@* __restrict__ v, const @ELEM@* __restrict__ bias, const float scale,
    const int s_len, const int t_len, const int n1, const int n2,
    const @INDEX@ q0, const @INDEX@ q1, const @INDEX@ q2, const @INDEX@ qs, const @INDEX@ qd,
    const @INDEX@ k0, const @INDEX@ k1, const @INDEX@ k2, const @INDEX@ kt, const @INDEX@ kd,
    const @INDEX@ v0, const @INDEX@ v1, const @INDEX@ v2, const @INDEX@ vt, const @INDEX@ ve,
    const @INDEX@ b0, const @INDEX@ b1, const @INDEX@ b2, const @INDEX@ bs, const @INDEX@ bt,
    const @INDEX@ o0, const @INDEX@ o1, const @INDEX@ o2, const @INDEX@ os, const @INDEX@ oe) {
  KN_PDL_BEGIN();
  using namespace kn::attn;
  typedef @INDEX@ idx_t;
  constexpr int RI = @ROWS_PER_THREAD@;
  constexpr int BM = 16 * RI;
  constexpr int BN = @BLOCK_N@;
  constexpr int CJ = BN / 8;
  constexpr int D = @D@;
  constexpr int E = @E@;
  constexpr bool HAS_BIAS = @HAS_BIAS@;
  constexpr int EL = (E + 7) / 8;
  constexpr int EW = EL * 8;
  constexpr int QS = D + 1;  // padded rows: no bank conflicts when threads read along keys
  constexpr int PS = BN + 1;
  float* q_tile = reinterpret_cast<float*>(smem);
  float* k_tile = q_tile + BM * QS;
  float* v_tile = k_tile + BN * QS;
  float* p_tile = v_tile + BN * EW;
  const int tid = threadIdx.x;
  const int tx = tid & 7;
  const int ty = tid >> 3;
  const int m_tiles = (s_len + BM - 1) / BM;
  const idx_t head = (idx_t)(blockIdx.x / (unsigned)m_tiles);
  const int m0 = (int)(blockIdx.x % (unsigned)m_tiles) * BM;
  const idx_t qb = head_offset(head, n1, n2, q0, q1, q2);
  const idx_t kb = head_offset(head, n1, n2, k0, k1, k2);
  const idx_t vb = head_offset(head, n1, n2, v0, v1, v2);
  const idx_t bb = HAS_BIAS ? head_offset(head, n1, n2, b0, b1, b2) : 0;
  const idx_t ob = head_offset(head, n1, n2, o0, o1, o2);
  for (int index = tid; index < BM * D; index += 128) {
    const int r = index / D;
    const int d = index % D;
    const int row = m0 + r;
    q_tile[r * QS + d] = row < s_len ? kn::cvt<float>(q[qb + row * qs + d * qd]) * scale : 0.0f;
  }
  float m_i[RI];
  float l_i[RI];
  float acc[RI][EL];
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    m_i[i] = -KN_INF_F;
    l_i[i] = 0.0f;
#pragma unroll
    for (int l = 0; l < EL; ++l) acc[i][l] = 0.0f;
  }
  for (int n0 = 0; n0 < t_len; n0 += BN) {
    __syncthreads();
    for (int index = tid; index < BN * D; index += 128) {
      const int n = index / D;
      const int d = index % D;
      const int key = n0 + n;
      k_tile[n * QS + d] = key < t_len ? kn::cvt<float>(k[kb + key * kt + d * kd]) : 0.0f;
    }
    for (int index = tid; index < BN * EW; index += 128) {
      const int n = index / EW;
      const int e = index % EW;
      const int key = n0 + n;
      v_tile[n * EW + e] =
          (key < t_len && e < E) ? kn::cvt<float>(v[vb + key * vt + e * ve]) : 0.0f;
    }
    __syncthreads();
    float sc[RI][CJ];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < CJ; ++j) sc[i][j] = 0.0f;
    for (int d = 0; d < D; ++d) {
      float qv[RI];
#pragma unroll
      for (int i = 0; i < RI; ++i) qv[i] = q_tile[(ty + 16 * i) * QS + d];
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const float kv = k_tile[(tx + 8 * j) * QS + d];
#pragma unroll
        for (int i = 0; i < RI; ++i) sc[i][j] += qv[i] * kv;
      }
    }
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const int row = m0 + ty + 16 * i;
      float top = -KN_INF_F;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const int key = n0 + tx + 8 * j;
        float s = -KN_INF_F;
        if (key < t_len) {
          s = sc[i][j];
          if constexpr (HAS_BIAS) {
            if (row < s_len) s += kn::cvt<float>(bias[bb + row * bs + key * bt]);
          }
        }
        sc[i][j] = s;
        top = fmaxf(top, s);
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 4));
      const float m_new = fmaxf(m_i[i], top);
      // A row whose keys so far are all masked (-inf) keeps sum 0 instead of NaN.
      const bool empty = m_new == -KN_INF_F;
      const float alpha = empty ? 1.0f : expf(m_i[i] - m_new);
      float total = 0.0f;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const float p = empty ? 0.0f : expf(sc[i][j] - m_new);
        p_tile[(ty + 16 * i) * PS + tx + 8 * j] = p;
        total += p;
      }
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      total += __shfl_xor_sync(0xffffffffu, total, 4);
      l_i[i] = l_i[i] * alpha + total;
      m_i[i] = m_new;
#pragma unroll
      for (int l = 0; l < EL; ++l) acc[i][l] *= alpha;
    }
    __syncthreads();
    for (int n = 0; n < BN; ++n) {
      float vv[EL];
#pragma unroll
      for (int l = 0; l < EL; ++l) vv[l] = v_tile[n * EW + tx + 8 * l];
#pragma unroll
      for (int i = 0; i < RI; ++i) {
        const float p = p_tile[(ty + 16 * i) * PS + n];
#pragma unroll
        for (int l = 0; l < EL; ++l) acc[i][l] += p * vv[l];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int row = m0 + ty + 16 * i;
    if (row >= s_len) continue;
#pragma unroll
    for (int l = 0; l < EL; ++l) {
      const int e = tx + 8 * l;
      if (e < E) out[ob + row * os + e * oe] = kn::cvt<@ELEM@>(acc[i][l] / l_i[i]);
    }
  }
}
