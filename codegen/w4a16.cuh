// codegen/w4a16.cuh: weight-only int4 matrix products, Y[M, N] = A[M, K] @ W[N, K]^T + bias, for
// float16 or bfloat16 activations A (T) and W packed as onnxruntime's MatMulNBits stores it:
//   B       uint8 [N, K_pad / 2], K_pad = k_blocks * BLOCK: the codes of row n, two a byte, the
//           even k in the low nibble (so a little-endian 32-bit word holds 8 consecutive codes,
//           code j in bits 4j..4j+3);
//   scales  T [N, k_blocks];
//   zeros   uint8 [N, ceil(k_blocks / 2)], two 4-bit zero points a byte, or null (then 8);
//   W[n, k] = (code - zero) * scale, rounded once to T (as "dequantize, then multiply").
// Sizes are arguments. Needs K % 8 == 0 (16-byte rows of A) and K_pad % 32 == 0 (16-byte weight
// loads); knopt/cuda/w4a16.py checks both before it launches anything.
//
// Both kernels dequantize in registers and multiply on the tensor cores with
// mma.m16n8k16 (fp32 accumulation), with the weight as the 16-row operand and A as the 8-column
// one ("swap AB"): a warp owns 16 rows of W (output features), and each lane loads 16 bytes
// (32 codes) of two of them, rows g and g + 8 (g = lane / 4, t = lane % 4), at
// k = chunk * 128 + 32 t, so the four lanes of a row read 64 contiguous bytes.
//
// The order of the k terms inside one mma is free as long as both operands agree. From a word
// of 8 codes (k0 .. k0 + 7) the dequantization yields the pairs P_q = {code q, code q + 4}
// (q = 0..3; a shift and a mask each), so the mma's logical columns (2t, 2t + 1) and
// (2t + 8, 2t + 9) hold P_0 and P_1 in the first mma of the word and P_2 and P_3 in the second;
// the matching activations {A[k0 + q], A[k0 + q + 4]} come from one 16-byte load by a byte
// permute. Results: lane (g, t) accumulates Y[2t + {0, 1}][rows g, g + 8] of its tile.
#pragma once
#include "common.cuh"

namespace w4 {

typedef unsigned int u32;
typedef unsigned char u8;

constexpr int CHUNK = 128;  // k per warp step: 4 lanes x 32 codes per row

// The same 32 bits seen as another 4-byte type (half pairs and words).
template <typename To, typename From> __device__ __forceinline__ To bits(const From& x) {
  static_assert(sizeof(To) == sizeof(From), "bits: sizes differ");
  return *reinterpret_cast<const To*>(&x);
}

__device__ __forceinline__ u32 word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T> struct Ty;

// Magic-number conversion: OR-ing a 4-bit code into the mantissa of 1024.0 (fp16) or 128.0
// (bf16) gives exactly 1024 + code (128 + code); subtracting 1024 + zero, whose bits are MAGIC
// + zero, is exact too.
template <> struct Ty<__half> {
  static constexpr u32 MAGIC = 0x64006400u;
  static __device__ __forceinline__ u32 sub_mul(u32 v, u32 zero, u32 scale) {
    typedef __half2 T2;
    return bits<u32>(__hmul2(__hsub2(bits<T2>(v), bits<T2>(zero)), bits<T2>(scale)));
  }
  static __device__ __forceinline__ void mma(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

template <> struct Ty<__nv_bfloat16> {
  static constexpr u32 MAGIC = 0x43004300u;
  static __device__ __forceinline__ u32 sub_mul(u32 v, u32 zero, u32 scale) {
    typedef __nv_bfloat162 T2;
    return bits<u32>(__hmul2(__hsub2(bits<T2>(v), bits<T2>(zero)), bits<T2>(scale)));
  }
  static __device__ __forceinline__ void mma(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// The four dequantized pairs P_q = {code q, code q + 4} of one word, as (code - zero) * scale.
template <typename T>
__device__ __forceinline__ void dequant(u32 w, u32 zero, u32 scale, u32 p[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    p[q] = Ty<T>::sub_mul(((w >> (4 * q)) & 0x000F000Fu) | Ty<T>::MAGIC, zero, scale);
  }
}

// The activation operand of the two mmas of word i: {A[k0 + q], A[k0 + q + 4]} pairs.
__device__ __forceinline__ void act_frags(const uint4& x, u32 b0[2], u32 b1[2]) {
  b0[0] = __byte_perm(x.x, x.z, 0x5410);  // k0 + 0, k0 + 4
  b0[1] = __byte_perm(x.x, x.z, 0x7632);  // k0 + 1, k0 + 5
  b1[0] = __byte_perm(x.y, x.w, 0x5410);  // k0 + 2, k0 + 6
  b1[1] = __byte_perm(x.y, x.w, 0x7632);  // k0 + 3, k0 + 7
}

// Where one lane's two rows of a 16-row tile live, and what the weight format's sizes are.
template <typename T, int BLOCK> struct Tile {
  const u8* rows[2];
  const T* scales[2];
  const u8* zeros[2];
  bool ok[2];
  int kp;  // K padded to whole blocks

  __device__ Tile(const u8* b, const T* s, const u8* z, int n, int k, int first_row) {
    const int blocks = (k + BLOCK - 1) / BLOCK;
    kp = blocks * BLOCK;
    const int zero_bytes = (blocks + 1) / 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = first_row + 8 * h;
      ok[h] = r < n;
      const int safe = ok[h] ? r : 0;
      rows[h] = b + (size_t)safe * (kp / 2);
      scales[h] = s + (size_t)safe * blocks;
      zeros[h] = z ? z + (size_t)safe * zero_bytes : nullptr;
    }
  }
};

// One lane's weights for one chunk: 32 codes of each of its two rows, with the raw bits of their
// scales and the bytes holding their zero points. Nothing loaded is used before `frags`, so a
// load in flight never stalls the warp until its chunk is computed. A block of 16 meets two
// blocks in 32 codes, larger ones one.
template <typename T, int BLOCK> struct Chunk {
  static constexpr int SPL = BLOCK >= 32 ? 1 : 2;
  uint4 q[2];
  u32 scale[2][SPL];  // the 16 bits of the scale
  u32 zero[2][SPL];   // the byte holding the zero point (0x88 when there are none: 8)
  u32 shift[SPL];     // where in that byte: 0 or 4

  __device__ __forceinline__ void load(const Tile<T, BLOCK>& tile, int k0) {
#pragma unroll
    for (int j = 0; j < SPL; ++j) shift[j] = (((k0 + 16 * j) / BLOCK) & 1) * 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool valid = tile.ok[h] && k0 < tile.kp;
      q[h] = valid ? __ldcs(reinterpret_cast<const uint4*>(tile.rows[h] + k0 / 2))
                   : make_uint4(0u, 0u, 0u, 0u);
      const unsigned short* scale_bits = reinterpret_cast<const unsigned short*>(tile.scales[h]);
#pragma unroll
      for (int j = 0; j < SPL; ++j) {
        const int blk = (k0 + 16 * j) / BLOCK;
        scale[h][j] = valid ? (u32)__ldg(scale_bits + blk) : 0u;
        zero[h][j] = valid && tile.zeros[h] ? (u32)__ldg(tile.zeros[h] + (blk >> 1)) : 0x88u;
      }
    }
  }

  // The A-operand fragments of the two mmas of word i (rows g, g + 8 of the tile).
  __device__ __forceinline__ void frags(int i, u32 a0[4], u32 a1[4]) const {
    const int j = SPL == 2 ? i >> 1 : 0;
    u32 p[4], r[4];
    dequant<T>(word(q[0], i), zero_pair(0, j), scale[0][j] * 0x00010001u, p);
    dequant<T>(word(q[1], i), zero_pair(1, j), scale[1][j] * 0x00010001u, r);
    a0[0] = p[0]; a0[1] = r[0]; a0[2] = p[1]; a0[3] = r[1];
    a1[0] = p[2]; a1[1] = r[2]; a1[2] = p[3]; a1[3] = r[3];
  }

  // {MAGIC + zero, MAGIC + zero}: the zero point plus 1024 (fp16) or 128 (bf16), in both halves.
  __device__ __forceinline__ u32 zero_pair(int h, int j) const {
    return (((zero[h][j] >> shift[j]) & 15u) * 0x00010001u) + Ty<T>::MAGIC;
  }
};

// Lane (g, t)'s four results: Y[col][row] for rows g, g + 8 and cols 2t, 2t + 1 of the tile.
template <typename T>
__device__ __forceinline__ void store(const float acc[4], int row0, int col0, int m, int n,
                                      const T* __restrict__ bias, T* __restrict__ y) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = row0 + (e >> 1) * 8;
    const int col = col0 + (e & 1);
    if (row < n && col < m) {
      const float b = bias ? Ty<T>::to_float(bias[row]) : 0.0f;
      y[(size_t)col * n + row] = Ty<T>::from_float(acc[e] + b);
    }
  }
}

// ---- M <= 8: one 16-row tile a block, its K split over the block's warps ---------------
// Bandwidth-bound: what matters is how many weight bytes are in flight (Little's law: about
// 4 MB on an H200). Each warp keeps the loads of its next two chunks outstanding while it
// computes one, in three register buffers whose roles rotate by unrolling (a copy between
// buffers would wait for the load in flight), so 16 warps an SM have 32 KB of weights in
// flight. A (at most 8 rows, an L2 hit) is the mma's 8-column operand, loaded from global
// memory when its chunk is computed; lanes whose column g is past M feed zeros.
template <typename T, int BLOCK>
__device__ __forceinline__ void gemv_chunk(float acc[4], const Chunk<T, BLOCK>& w,
                                           const T* __restrict__ arow, bool has_row, int k,
                                           int k0) {
  uint4 x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int kk = k0 + 8 * i;
    x[i] = (has_row && kk < k) ? __ldg(reinterpret_cast<const uint4*>(arow + kk))
                               : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 a0[4], a1[4], b0[2], b1[2];
    w.frags(i, a0, a1);
    act_frags(x[i], b0, b1);
    Ty<T>::mma(acc, a0, b0);
    Ty<T>::mma(acc, a1, b1);
  }
}

template <typename T, int BLOCK, int WARPS>
__device__ __forceinline__ void gemv(const T* __restrict__ a, const u8* __restrict__ b,
                                     const T* __restrict__ scales, const u8* __restrict__ zeros,
                                     const T* __restrict__ bias, T* __restrict__ y, int m, int n,
                                     int k) {
  __shared__ float partial[WARPS][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16 + g;
  const Tile<T, BLOCK> tile(b, scales, zeros, n, k, row0);
  const int chunks = (tile.kp + CHUNK - 1) / CHUNK;
  const T* arow = a + (size_t)(g < m ? g : 0) * k;
  const bool has_row = g < m;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Chunk<T, BLOCK> w0, w1, w2;
  // Chunk c of this warp starts at k = c * CHUNK + 32 t for this lane.
  auto start = [&](int c) { return c * CHUNK + 32 * t; };
  if (warp < chunks) w0.load(tile, start(warp));
  if (warp + WARPS < chunks) w1.load(tile, start(warp + WARPS));
  for (int c = warp; c < chunks; c += 3 * WARPS) {
    if (c + 2 * WARPS < chunks) w2.load(tile, start(c + 2 * WARPS));
    gemv_chunk<T, BLOCK>(acc, w0, arow, has_row, k, start(c));
    if (c + WARPS >= chunks) break;
    if (c + 3 * WARPS < chunks) w0.load(tile, start(c + 3 * WARPS));
    gemv_chunk<T, BLOCK>(acc, w1, arow, has_row, k, start(c + WARPS));
    if (c + 2 * WARPS >= chunks) break;
    if (c + 4 * WARPS < chunks) w1.load(tile, start(c + 4 * WARPS));
    gemv_chunk<T, BLOCK>(acc, w2, arow, has_row, k, start(c + 2 * WARPS));
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) partial[warp][lane][e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += partial[w][lane][e];
    acc[e] = sum;
  }
  store<T>(acc, row0, 2 * t, m, n, bias, y);
}

// ---- M > 8: 64 x 64 output tiles, A staged in shared memory ---------------------------------
// Four warps own 16 rows of W each; all read the block's 64 rows of A from shared memory, which
// cp.async fills one chunk ahead (two stages). A row of a stage holds its 128 k in 16 slots of
// 16 bytes, slot 4 i + t holding k = 32 t + 8 i .. + 7 (the bytes lane (g, t) reads for word i),
// and rows are 320 bytes apart: the eight lanes of each phase of a 16-byte shared load then hit
// all 32 banks once. gridDim.z > 1 splits K: each split writes fp32 partial sums, which
// w4a16_reduce.cu adds up.
constexpr int GEMM_WARPS = 4;
constexpr int BM = 64;                   // A rows (output columns) a block
constexpr int BN = 16 * GEMM_WARPS;      // W rows (output features) a block
constexpr int ROW_WORDS = 80;            // 64 words of data + 16 of padding
constexpr int STAGE_WORDS = BM * ROW_WORDS;

__device__ __forceinline__ void cp_async16(u32* dst, const void* src, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  const int size = valid ? 16 : 0;  // 0: fill with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

template <typename T>
__device__ __forceinline__ void stage_a(u32* stage, const T* __restrict__ a, int m0, int m,
                                        int k, int kc) {
#pragma unroll
  for (int j = 0; j < BM * 16 / (32 * GEMM_WARPS); ++j) {
    const int piece = threadIdx.x + 32 * GEMM_WARPS * j;
    const int row = piece >> 4, slot = piece & 15;
    const int kk = kc + 32 * (slot & 3) + 8 * (slot >> 2);
    const bool valid = m0 + row < m && kk < k;
    const T* src = valid ? a + (size_t)(m0 + row) * k + kk : a;
    cp_async16(stage + row * ROW_WORDS + slot * 4, src, valid);
  }
}

template <typename T, int BLOCK>
__device__ __forceinline__ void gemm(const T* __restrict__ a, const u8* __restrict__ b,
                                     const T* __restrict__ scales, const u8* __restrict__ zeros,
                                     const T* __restrict__ bias, T* __restrict__ y,
                                     float* __restrict__ partial, int m, int n, int k) {
  __shared__ __align__(16) u32 smem[2 * STAGE_WORDS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * BN + 16 * warp + g;
  const int m0 = blockIdx.y * BM;
  const Tile<T, BLOCK> tile(b, scales, zeros, n, k, row0);
  const int chunks = (tile.kp + CHUNK - 1) / CHUNK;
  const int per_split = (chunks + gridDim.z - 1) / gridDim.z;
  const int begin = blockIdx.z * per_split;
  const int end = min(chunks, begin + per_split);
  const int tiles = min(BM / 8, (m - m0 + 7) / 8);  // column tiles of 8 with any valid column
  float acc[BM / 8][4];
#pragma unroll
  for (int mt = 0; mt < BM / 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  Chunk<T, BLOCK> cur, next;
  if (begin < end) {
    stage_a<T>(smem, a, m0, m, k, begin * CHUNK);
    cp_async_commit();
    cur.load(tile, begin * CHUNK + 32 * t);
  }
  int stage = 0;
  for (int c = begin; c < end; ++c) {
    const bool more = c + 1 < end;
    if (more) {
      stage_a<T>(smem + (stage ^ 1) * STAGE_WORDS, a, m0, m, k, (c + 1) * CHUNK);
      cp_async_commit();
      next.load(tile, (c + 1) * CHUNK + 32 * t);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const u32* rows = smem + stage * STAGE_WORDS + g * ROW_WORDS;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u32 a0[4], a1[4];
      cur.frags(i, a0, a1);
#pragma unroll
      for (int mt = 0; mt < BM / 8; ++mt) {
        if (mt < tiles) {
          const uint4 x =
              *reinterpret_cast<const uint4*>(rows + mt * 8 * ROW_WORDS + (4 * i + t) * 4);
          u32 b0[2], b1[2];
          act_frags(x, b0, b1);
          Ty<T>::mma(acc[mt], a0, b0);
          Ty<T>::mma(acc[mt], a1, b1);
        }
      }
    }
    __syncthreads();  // the next iteration refills this stage's partner, then this one
    cur = next;
    stage ^= 1;
  }
#pragma unroll
  for (int mt = 0; mt < BM / 8; ++mt) {
    const int col0 = m0 + mt * 8 + 2 * t;
    if (gridDim.z == 1) {
      store<T>(acc[mt], row0, col0, m, n, bias, y);
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + (e >> 1) * 8;
      const int col = col0 + (e & 1);
      if (row < n && col < m) partial[((size_t)blockIdx.z * m + col) * n + row] = acc[mt][e];
    }
  }
}

}  // namespace w4
