// codegen/attention.cu: flash attention, softmax(q k^T * scale + bias) v without materializing
// the scores. A block takes BM = 16 * RI query rows of one head and walks the keys in tiles of
// BN, keeping a running max and sum per row (online softmax). 128 threads as 16 x 8: thread
// (ty, tx) owns rows ty + 16 i and, per key tile, columns tx + 8 j; for the output, value
// columns tx + 8 l. Tiles of q, k, v and the probabilities sit in shared memory as float.
extern "C" __global__ void __launch_bounds__(128) @NAME@(@PARAMS@) {
  typedef @INDEX@ idx_t;
  constexpr int RI = @ROWS_PER_THREAD@;
  constexpr int BM = 16 * RI;
  constexpr int BN = @BLOCK_N@;
  constexpr int CJ = BN / 8;
  constexpr int D = @D@;
  constexpr int E = @E@;
  constexpr int EL = (E + 7) / 8;
  constexpr int EW = EL * 8;
  constexpr idx_t S = @S@;
  constexpr idx_t T = @T@;
  constexpr int QS = D + 1;  // padded rows: no bank conflicts when threads read along keys
  constexpr int PS = BN + 1;
  extern __shared__ float smem[];
  float* qs = smem;
  float* ks = qs + BM * QS;
  float* vs = ks + BN * QS;
  float* ps = vs + BN * EW;
  const int tid = threadIdx.x;
  const int tx = tid & 7;
  const int ty = tid >> 3;
  const idx_t tiles = (S + BM - 1) / BM;
  const idx_t head = (idx_t)blockIdx.x / tiles;
  const idx_t m0 = ((idx_t)blockIdx.x % tiles) * BM;
@HEAD@
  for (int index = tid; index < BM * D; index += 128) {
    const int r = index / D;
    const int d = index % D;
    const idx_t row = m0 + r;
    qs[r * QS + d] = row < S ? (float)(@LOAD_Q@) * (@SCALE@) : 0.0f;
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
  for (idx_t n0 = 0; n0 < T; n0 += BN) {
    __syncthreads();
    for (int index = tid; index < BN * D; index += 128) {
      const int n = index / D;
      const int d = index % D;
      const idx_t key = n0 + n;
      ks[n * QS + d] = key < T ? (float)(@LOAD_K@) : 0.0f;
    }
    for (int index = tid; index < BN * EW; index += 128) {
      const int n = index / EW;
      const int e = index % EW;
      const idx_t key = n0 + n;
      vs[n * EW + e] = (key < T && e < E) ? (float)(@LOAD_V@) : 0.0f;
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
      for (int i = 0; i < RI; ++i) qv[i] = qs[(ty + 16 * i) * QS + d];
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const float kv = ks[(tx + 8 * j) * QS + d];
#pragma unroll
        for (int i = 0; i < RI; ++i) sc[i][j] += qv[i] * kv;
      }
    }
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const idx_t row = m0 + ty + 16 * i;
      float top = -KN_INF_F;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const idx_t key = n0 + tx + 8 * j;
        float s = -KN_INF_F;
        if (key < T) s = sc[i][j] + (row < S ? (float)(@LOAD_BIAS@) : 0.0f);
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
        ps[(ty + 16 * i) * PS + tx + 8 * j] = p;
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
      for (int l = 0; l < EL; ++l) vv[l] = vs[n * EW + tx + 8 * l];
#pragma unroll
      for (int i = 0; i < RI; ++i) {
        const float p = ps[(ty + 16 * i) * PS + n];
#pragma unroll
        for (int l = 0; l < EL; ++l) acc[i][l] += p * vv[l];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const idx_t row = m0 + ty + 16 * i;
    if (row >= S) continue;
#pragma unroll
    for (int l = 0; l < EL; ++l) {
      const int e = tx + 8 * l;
      if (e < E) out[ob + row * E + e] = @STORE@;
    }
  }
}
