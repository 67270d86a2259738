// codegen/attention_mma.cu: flash attention on tensor cores for f16 and bf16,
// out = softmax(q k^T * scale + bias) v, with f32 accumulation and an f32 online softmax.
//
// A block of 128 threads is WARPS_M x WARPS_N warps. It takes BM = 16 WARPS_M query rows of one
// head (kept in shared memory, or as mma fragments in registers for head sizes up to 128) and
// walks keys [split * chunk, min(t_len, (split + 1) * chunk)) in tiles of BLOCK_N, copied to
// shared memory with cp.async into two buffers: tile i + 1 loads while tile i computes. Each
// warp owns 16 query rows and BLOCK_N / WARPS_N keys of a tile: S = q k^T with
// mma.m16n8k16 (fragments through ldmatrix), running max and sum per row in f32, P rounded to
// the 16-bit type for P v. Prefill uses 4 x 1 warps; decoding (a few query rows, many keys)
// uses 1 x 4, whose warps' partial results merge through shared memory at the end.
//
// Arguments (sizes and strides are run-time values: one compiled kernel serves every length):
//   out, q, k, v, bias  [..., s_len, E], [..., s_len, D], [..., t_len, D], [..., t_len, E],
//                       [..., s_len, t_len] (bias is not read when HAS_BIAS is false)
//   ws                  f32 partials when splits > 1: [splits, heads, s_len, EP] unnormalized
//                       outputs, then [splits, heads, s_len, 2] (running max, sum). Unused
//                       when splits == 1.
//   tickets             when splits > 1, one counter per row tile (grid x), zero before the
//                       launch and zero again after it: the last of a row tile's splits to
//                       finish merges the partials (see the end). Unused when splits == 1.
//   scale               the factor of q k^T
//   s_len, t_len        query and key counts
//   n1, n2              sizes of the 2nd and 3rd of three leading (head) axes
//   q0 q1 q2 qs qd      q's strides: three leading axes, rows, columns (in elements); then the
//   k0 .. kd, v0 .. ve, b0 .. bt, o0 .. oe   same for k, v, bias and out
//   heads               the number of heads (product of the three leading sizes)
//   chunk, splits       keys per split (a multiple of BLOCK_N) and the number of splits
// Grid: (heads * ceil(s_len / BM), splits); 128 threads; dynamic shared memory as the generator
// computes it. VEC_Q/K/V: that operand's columns are dense and its rows 16-byte aligned.
// CAUSAL: the bias is a causal mask aligned to the last key (key <= row + t_len - s_len is
// visible): it is computed from the indices, never read, and key tiles past a row tile's last
// visible key are skipped.
#include "attention.cuh"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "knopt's tensor-core attention needs sm_80 or newer"
#endif
extern "C" __global__ void __launch_bounds__(128) @NAME@(
    @ELEM@* __restrict__ out, const @ELEM@* __restrict__ q, const @ELEM@* __restrict__ k,
    const @ELEM@* __restrict__ v, const @ELEM@* __restrict__ bias, float* __restrict__ ws, int* __restrict__ tickets,
    const float scale, const int s_len, const int t_len, const int n1, const int n2,
    const @INDEX@ q0, const @INDEX@ q1, const @INDEX@ q2, const @INDEX@ qs, const @INDEX@ qd,
    const @INDEX@ k0, const @INDEX@ k1, const @INDEX@ k2, const @INDEX@ kt, const @INDEX@ kd,
    const @INDEX@ v0, const @INDEX@ v1, const @INDEX@ v2, const @INDEX@ vt, const @INDEX@ ve,
    const @INDEX@ b0, const @INDEX@ b1, const @INDEX@ b2, const @INDEX@ bs, const @INDEX@ bt,
    const @INDEX@ o0, const @INDEX@ o1, const @INDEX@ o2, const @INDEX@ os, const @INDEX@ oe,
    const int heads, const int chunk, const int splits) {
  KN_PDL_BEGIN();
  using namespace kn::attn;
  typedef @INDEX@ idx_t;
  typedef @ELEM@ elem;
  typedef Mma<elem> mma;
  constexpr int WM = @WARPS_M@;
  constexpr int WN = @WARPS_N@;
  constexpr int BN = @BLOCK_N@;
  constexpr int D = @D@;
  constexpr int E = @E@;
  constexpr bool HAS_BIAS = @HAS_BIAS@;
  constexpr bool CAUSAL = @CAUSAL@;
  static_assert(!(HAS_BIAS && CAUSAL), "a causal mask is computed, not read");
  constexpr int DP = (D + 15) / 16 * 16;  // head sizes padded to whole mma steps with zeros
  constexpr int EP = (E + 15) / 16 * 16;
  constexpr int BM = 16 * WM;
  constexpr int WK = BN / WN;  // keys per warp per tile
  constexpr int NT = WK / 8;   // 16 x 8 score tiles per warp
  constexpr int KS = DP / 16;  // k-steps of q k^T
  constexpr int ET = EP / 8;   // 16 x 8 output tiles per warp
  // Row pitches 16 bytes longer than a row: the 8 rows one ldmatrix reads hit all 32 banks.
  constexpr int SQ = DP + 8;
  constexpr int SV = EP + 8;
  constexpr bool Q_REGS = DP <= 128;
  static_assert(WM * WN == 4 && WK % 16 == 0, "4 warps, whole 16-key steps per warp");

  elem* q_tile = reinterpret_cast<elem*>(smem);
  elem* k_tiles = q_tile + BM * SQ;     // 2 x [BN][SQ]
  elem* v_tiles = k_tiles + 2 * BN * SQ;  // 2 x [BN][SV]

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp % WM;
  const int wn = warp / WM;
  const int g = lane >> 2;        // the fragment row (and row + 8) this lane holds
  const int c2 = 2 * (lane & 3);  // the fragment column pair this lane holds
  const int m_tiles = (s_len + BM - 1) / BM;
  const idx_t head = (idx_t)(blockIdx.x / (unsigned)m_tiles);
  // Last row tile first: under a causal mask it has the most keys, so it should start early.
  const int m0 = (m_tiles - 1 - (int)(blockIdx.x % (unsigned)m_tiles)) * BM;
  const int split = blockIdx.y;
  const int diagonal = t_len - s_len;  // row r sees keys up to r + diagonal (CAUSAL)
  const int k_begin = split * chunk;
  const int k_end = CAUSAL ? min(min(t_len, k_begin + chunk), min(s_len, m0 + BM) + diagonal)
                           : min(t_len, k_begin + chunk);
  const int n_tiles = max(0, (k_end - k_begin + BN - 1) / BN);
  const idx_t qb = head_offset(head, n1, n2, q0, q1, q2);
  const idx_t kb = head_offset(head, n1, n2, k0, k1, k2);
  const idx_t vb = head_offset(head, n1, n2, v0, v1, v2);

  load_tile<elem, idx_t, BM, D, DP, SQ, @VEC_Q@>(q_tile, q, qb, m0, s_len, qs, qd);
  if (n_tiles > 0) {
    load_tile<elem, idx_t, BN, D, DP, SQ, @VEC_K@>(k_tiles, k, kb, k_begin, k_end, kt, kd);
    load_tile<elem, idx_t, BN, E, EP, SV, @VEC_V@>(v_tiles, v, vb, k_begin, k_end, vt, ve);
  }
  cp_async_commit();

  float acc[ET][4];
#pragma unroll
  for (int j = 0; j < ET; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m_run[2] = {-KN_INF_F, -KN_INF_F};  // rows g and g + 8 of the warp's 16
  float l_run[2] = {0.0f, 0.0f};            // this lane's part of the row sums
  unsigned q_frag[Q_REGS ? KS : 1][4];
  const int row_g = m0 + wm * 16 + g;
  const idx_t bb = HAS_BIAS ? head_offset(head, n1, n2, b0, b1, b2) : 0;

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile `it` is in place and every warp is done with tile it - 1
    const int n0 = k_begin + it * BN;
    const elem* k_tile = k_tiles + (it & 1) * BN * SQ;
    const elem* v_tile = v_tiles + (it & 1) * BN * SV;
    if (it + 1 < n_tiles) {
      elem* k_next = k_tiles + ((it + 1) & 1) * BN * SQ;
      elem* v_next = v_tiles + ((it + 1) & 1) * BN * SV;
      load_tile<elem, idx_t, BN, D, DP, SQ, @VEC_K@>(k_next, k, kb, n0 + BN, k_end, kt, kd);
      load_tile<elem, idx_t, BN, E, EP, SV, @VEC_V@>(v_next, v, vb, n0 + BN, k_end, vt, ve);
    }
    cp_async_commit();
    if constexpr (Q_REGS) {
      if (it == 0) {
#pragma unroll
        for (int s = 0; s < KS; ++s)
          ldmatrix_x4(q_frag[s], q_tile + (wm * 16 + (lane & 15)) * SQ + s * 16 + (lane >> 4) * 8);
      }
    }

    // ---- S = q k^T over this warp's WK keys ----
    float sc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      unsigned a[4];
      if constexpr (Q_REGS) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = q_frag[s][i];
      } else {
        ldmatrix_x4(a, q_tile + (wm * 16 + (lane & 15)) * SQ + s * 16 + (lane >> 4) * 8);
      }
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        // Matrices: keys 0-7 x d 0-7, keys 0-7 x d 8-15, keys 8-15 x d 0-7, keys 8-15 x d 8-15.
        unsigned b[4];
        const int key = wn * WK + p * 16 + (lane >> 4) * 8 + (lane & 7);
        ldmatrix_x4(b, k_tile + key * SQ + s * 16 + ((lane >> 3) & 1) * 8);
        mma::run(sc[2 * p], a, b[0], b[1]);
        mma::run(sc[2 * p + 1], a, b[2], b[3]);
      }
    }

    // ---- online softmax: scale, bias, mask keys past the range, rescale what came before ----
    float top[2] = {-KN_INF_F, -KN_INF_F};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1;
        const int key = n0 + wn * WK + j * 8 + c2 + (i & 1);
        const int row = row_g + 8 * r;
        float x = sc[j][i] * scale;
        if constexpr (HAS_BIAS) {
          if (row < s_len && key < k_end) x += kn::cvt<float>(bias[bb + row * bs + key * bt]);
        }
        x = (key < k_end && (!CAUSAL || key <= row + diagonal)) ? x : -KN_INF_F;
        sc[j][i] = x;
        top[r] = fmaxf(top[r], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 1));
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 2));
      const float m_new = fmaxf(m_run[r], top[r]);
      alpha[r] = rescale(m_run[r], m_new);
      m_run[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // A row with only -inf so far keeps p = 0 (and its sum 0) instead of NaN.
        const float p = rescale(sc[j][i], m_run[i >> 1]);
        sc[j][i] = p;
        sum[i >> 1] += p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
#pragma unroll
    for (int j = 0; j < ET; ++j) {
      acc[j][0] *= alpha[0];
      acc[j][1] *= alpha[0];
      acc[j][2] *= alpha[1];
      acc[j][3] *= alpha[1];
    }

    // ---- acc += P v: the score tiles 2p, 2p + 1 are the A fragment of key step p ----
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      unsigned a[4];
      a[0] = mma::pack(sc[2 * p][0], sc[2 * p][1]);
      a[1] = mma::pack(sc[2 * p][2], sc[2 * p][3]);
      a[2] = mma::pack(sc[2 * p + 1][0], sc[2 * p + 1][1]);
      a[3] = mma::pack(sc[2 * p + 1][2], sc[2 * p + 1][3]);
#pragma unroll
      for (int j = 0; j < EP / 16; ++j) {
        // Transposed matrices: keys 0-7 x e 0-7, keys 8-15 x e 0-7, keys 0-7 x e 8-15, ...
        unsigned b[4];
        const int key = wn * WK + p * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        ldmatrix_x4_trans(b, v_tile + key * SV + j * 16 + (lane >> 4) * 8);
        mma::run(acc[2 * j], a, b[0], b[1]);
        mma::run(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait_all();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const idx_t ob = head_offset(head, n1, n2, o0, o1, o2);
  const idx_t partials = (idx_t)splits * heads * s_len;  // rows of partial results
  float* ws_o = ws;
  float* ws_ml = ws + partials * EP;
  const idx_t part0 = ((idx_t)split * heads + head) * s_len;  // this block's first partial row

  if constexpr (WN == 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_g + 8 * r;
      if (row >= s_len) continue;
      if (splits == 1) {
        // An all -inf row has sum 0 and gives 0 * inf = NaN, as the CPU oracle does.
        const float inv = 1.0f / l_run[r];
#pragma unroll
        for (int j = 0; j < ET; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = j * 8 + c2 + c;
            if (e < E) out[ob + row * os + e * oe] = kn::cvt<elem>(acc[j][2 * r + c] * inv);
          }
        }
      } else {
        float* o_row = ws_o + (part0 + row) * EP;
#pragma unroll
        for (int j = 0; j < ET; ++j)
          *reinterpret_cast<float2*>(o_row + j * 8 + c2) =
              make_float2(acc[j][2 * r], acc[j][2 * r + 1]);
        if (c2 == 0) *reinterpret_cast<float2*>(ws_ml + (part0 + row) * 2) =
            make_float2(m_run[r], l_run[r]);
      }
    }
  } else {
    // Merge the WN warps that share rows: each one's (max, sum) first, then its outputs
    // weighted by exp(max - overall max), summed column by column by the whole block.
    __syncthreads();  // every warp is done with the tiles whose memory this reuses
    float* red_ml = reinterpret_cast<float*>(smem);  // [WN][BM][2]
    float* red_o = red_ml + WN * BM * 2;              // [WN][BM][EP]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (c2 == 0) {
        red_ml[(wn * BM + wm * 16 + g + 8 * r) * 2] = m_run[r];
        red_ml[(wn * BM + wm * 16 + g + 8 * r) * 2 + 1] = l_run[r];
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rr = wm * 16 + g + 8 * r;
      float overall = -KN_INF_F;
#pragma unroll
      for (int w = 0; w < WN; ++w) overall = fmaxf(overall, red_ml[(w * BM + rr) * 2]);
      const float f = rescale(m_run[r], overall);
#pragma unroll
      for (int j = 0; j < ET; ++j)
        *reinterpret_cast<float2*>(red_o + (wn * BM + rr) * EP + j * 8 + c2) =
            make_float2(acc[j][2 * r] * f, acc[j][2 * r + 1] * f);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < BM * EP; i += 128) {
      const int rr = i / EP;
      const int e = i % EP;
      const int row = m0 + rr;
      if (row >= s_len) continue;
      float overall = -KN_INF_F;
#pragma unroll
      for (int w = 0; w < WN; ++w) overall = fmaxf(overall, red_ml[(w * BM + rr) * 2]);
      float total = 0.0f;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < WN; ++w) {
        total += red_ml[(w * BM + rr) * 2 + 1] * rescale(red_ml[(w * BM + rr) * 2], overall);
        o += red_o[(w * BM + rr) * EP + e];
      }
      if (splits == 1) {
        if (e < E) out[ob + row * os + e * oe] = kn::cvt<elem>(o / total);
      } else {
        ws_o[(part0 + row) * EP + e] = o;
        if (e == 0) *reinterpret_cast<float2*>(ws_ml + (part0 + row) * 2) =
            make_float2(overall, total);
      }
    }
  }
  if (splits > 1)
    merge_splits<BM, E, EP>(out, ws_o, ws_ml, tickets, ob, os, oe, head, m0, s_len, heads, splits);
}
