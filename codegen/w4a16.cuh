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
// The kernels dequantize in registers and multiply on the tensor cores with mma.m16n8k16 (fp32
// accumulation), with the weight as the 16-row operand and A as the 8-column one ("swap AB"): a
// warp owns 16 rows of W (output features), and each lane loads 16 bytes (32 codes) of two of
// them, rows g and g + 8 (g = lane / 4, t = lane % 4), at k = chunk * 128 + 32 t, so the four
// lanes of a row read 64 contiguous bytes. Results: lane (g, t) accumulates Y[2t + {0, 1}][rows
// g, g + 8] of its 8-column tile.
//
// The order of the k terms inside one mma is free as long as both operands agree, which gives
// two ways to pair a word's 8 codes (k0 .. k0 + 7) into the mma's half2 registers:
//   "split" pairs {code q, code q + 4} (q = 0..3): a mask each, the cheapest dequantization; the
//     activations {A[k0 + q], A[k0 + q + 4]} then come from a 16-byte load by a byte permute
//     (the GEMV, where each activation fragment meets two weight rows);
//   "natural" pairs {code 2q, code 2q + 1}: a byte permute more a pair, but the activations are
//     used as loaded (the GEMM, where each weight fragment meets up to 8 activation tiles).
// Either way the mma's logical columns (2t, 2t + 1) and (2t + 8, 2t + 9) hold pairs 0 and 1 of
// the word in the first mma and pairs 2 and 3 in the second.
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
  typedef __half2 T2;
  static constexpr u32 MAGIC = 0x64006400u;
  static __device__ __forceinline__ u32 sub(u32 v, u32 zero) {
    return bits<u32>(__hsub2(bits<T2>(v), bits<T2>(zero)));
  }
  static __device__ __forceinline__ u32 mul(u32 v, u32 scale) {
    return bits<u32>(__hmul2(bits<T2>(v), bits<T2>(scale)));
  }
  static __device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

template <> struct Ty<__nv_bfloat16> {
  typedef __nv_bfloat162 T2;
  static constexpr u32 MAGIC = 0x43004300u;
  static __device__ __forceinline__ u32 sub(u32 v, u32 zero) {
    return bits<u32>(__hsub2(bits<T2>(v), bits<T2>(zero)));
  }
  static __device__ __forceinline__ u32 mul(u32 v, u32 scale) {
    return bits<u32>(__hmul2(bits<T2>(v), bits<T2>(scale)));
  }
  static __device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// ---- dequantization: (code - zero) exact in T, then one rounding by the scale ------------------

// (x & MASK) | BITS in one instruction (the compiler splits it in two when both are constants).
template <u32 MASK, u32 BITS> __device__ __forceinline__ u32 mask_or(u32 x) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(x), "n"(MASK), "n"(BITS));
  return r;
}

// The split pairs P_q = {code q, code q + 4} of one word (zero: the 4-bit zero point).
template <typename T> struct Split {
  static __device__ __forceinline__ void run(u32 w, u32 zero, u32 scale, u32 p[4]) {
    const u32 z = zero * 0x00010001u + Ty<T>::MAGIC;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      p[q] = Ty<T>::mul(Ty<T>::sub(mask_or<0x000F000Fu, Ty<T>::MAGIC>(w >> (4 * q)), z), scale);
    }
  }
};

// fp16 spares three of the shifts: the codes in bits 4..7 of each half, masked in place, give
// 1024 + 16 code, and one fma by 1/16 (exact: small integers) takes off 64 + zero.
template <> struct Split<__half> {
  static __device__ __forceinline__ void run(u32 w, u32 zero, u32 scale, u32 p[4]) {
    const u32 low = zero * 0x00010001u + 0x64006400u;          // 1024 + zero
    const u32 high = (zero << 4) * 0x00010001u + 0xD400D400u;  // -(64 + zero)
    const __half2 sixteenth = bits<__half2>(0x2C002C00u);      // 1 / 16
    const u32 w8 = w >> 8;
#pragma unroll
    for (int q = 0; q < 4; q += 2) {
      const u32 v = q == 0 ? w : w8;
      const u32 lo = mask_or<0x000F000Fu, 0x64006400u>(v);  // codes q, q + 4
      const u32 hi = mask_or<0x00F000F0u, 0x64006400u>(v);  // codes q + 1, q + 5, times 16
      p[q] = Ty<__half>::mul(Ty<__half>::sub(lo, low), scale);
      const __half2 h = __hfma2(bits<__half2>(hi), sixteenth, bits<__half2>(high));
      p[q + 1] = Ty<__half>::mul(bits<u32>(h), scale);
    }
  }
};

// The natural pairs N_q = {code 2q, code 2q + 1}: byte q of the word and of the word shifted by
// 4 put side by side (a byte permute), then masked as above.
template <typename T>
__device__ __forceinline__ void natural(u32 w, u32 zero, u32 scale, u32 p[4]) {
  const u32 z = zero * 0x00010001u + Ty<T>::MAGIC;
  const u32 w4 = w >> 4;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const u32 pair = __byte_perm(w, w4, q * 0x0011u + (q + 4) * 0x1100u);
    p[q] = Ty<T>::mul(Ty<T>::sub(mask_or<0x000F000Fu, Ty<T>::MAGIC>(pair), z), scale);
  }
}

// The activation operand of the two mmas of a word in split order: {A[k0 + q], A[k0 + q + 4]}.
__device__ __forceinline__ void split_acts(const uint4& x, u32 b[4]) {
  b[0] = __byte_perm(x.x, x.z, 0x5410);  // k0 + 0, k0 + 4
  b[1] = __byte_perm(x.x, x.z, 0x7632);  // k0 + 1, k0 + 5
  b[2] = __byte_perm(x.y, x.w, 0x5410);  // k0 + 2, k0 + 6
  b[3] = __byte_perm(x.y, x.w, 0x7632);  // k0 + 3, k0 + 7
}

// ---- where a lane's weights are, and one chunk of them in registers ----------------------------

// One lane's two rows (g and g + 8 of a 16-row tile) and the weight format's sizes, as 32-bit
// offsets into the kernel's arrays (knopt/cuda/w4a16.py refuses weights of 2^31 bytes or more),
// which keeps them in 6 registers. A row past N reads row g of the tile instead, or the tile's
// first row (always inside N), and a chunk past K_pad the row's first codes: such loads stay
// inside the arrays and feed only outputs that are never stored (rows past N) or products with
// zero activations (past K), so no load needs a predicate or a zero fill.
template <typename T, int BLOCK> struct Tile {
  const u8* b;                // codes
  const unsigned short* s;    // the bits of the scales
  const u8* z;                // zero points, or null
  u32 code_row[2], scale_row[2], zero_row[2];
  u32 kp;                     // K padded to whole blocks

  __device__ Tile(const u8* codes, const T* scales, const u8* zeros, int n, int k, int first_row)
      : b(codes), s(reinterpret_cast<const unsigned short*>(scales)), z(zeros) {
    const u32 blocks = ((u32)k + BLOCK - 1) / BLOCK;
    kp = blocks * BLOCK;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int wanted = first_row + 8 * h;
      const u32 r = wanted < n ? wanted : first_row < n ? first_row : 0;
      code_row[h] = r * (kp / 2);
      scale_row[h] = r * blocks;
      zero_row[h] = r * ((blocks + 1) / 2);
    }
  }
};

// One lane's weights for one chunk: 32 codes of each of its two rows, with the raw bits of their
// scales and the bytes holding their zero points. Nothing loaded is used before `frags`, so a
// load in flight never stalls the warp until its chunk is computed; where the codes start (k0)
// is passed again then rather than kept in a register. A block of 16 meets two blocks in 32
// codes (k0 / 16 is even: their two scales are one aligned 32-bit word, their zero points one
// byte), larger ones one.
template <typename T, int BLOCK> struct Chunk {
  uint4 q[2];
  u32 scale[2];  // the bits of the scale (of both blocks, the first low, for blocks of 16)
  u32 zero[2];   // the byte holding the zero point (0x88 when there are none: 8)

  __device__ __forceinline__ void load(const Tile<T, BLOCK>& tile, u32 k0) {
    const u32 kc = k0 < tile.kp ? k0 : 0u;  // past K_pad: the row's first codes
    const u32 blk = kc / BLOCK;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      q[h] = __ldcs(reinterpret_cast<const uint4*>(tile.b + (tile.code_row[h] + kc / 2)));
      const unsigned short* scales = tile.s + (tile.scale_row[h] + blk);
      if constexpr (BLOCK == 16) {
        scale[h] = __ldg(reinterpret_cast<const u32*>(scales));
      } else {
        scale[h] = (u32)__ldg(scales);
      }
      zero[h] = tile.z ? (u32)__ldg(tile.z + (tile.zero_row[h] + blk / 2)) : 0x88u;
    }
  }

  // The zero points (0..15) and scale pairs of the two rows, for the 16-code halves j of the
  // chunk that starts at k0 (one value for blocks of 32 and more), taken once a chunk.
  static constexpr int SPL = BLOCK == 16 ? 2 : 1;
  struct Consts {
    u32 zero[2][SPL];
    u32 scale[2][SPL];
  };
  __device__ __forceinline__ Consts consts(u32 k0) const {
    Consts c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < SPL; ++j) {
        c.zero[h][j] = (zero[h] >> ((((k0 + 16u * j) / BLOCK) & 1u) * 4u)) & 15u;
        if constexpr (BLOCK == 16) {
          c.scale[h][j] = __byte_perm(scale[h], 0u, j == 0 ? 0x1010 : 0x3232);
        } else {
          c.scale[h][j] = scale[h] * 0x00010001u;
        }
      }
    }
    return c;
  }

  // The A-operand fragments of the two mmas of word i, in split or natural order.
  template <bool NATURAL>
  __device__ __forceinline__ void frags(int i, const Consts& c, u32 a0[4], u32 a1[4]) const {
    const int j = SPL == 2 ? i >> 1 : 0;
    u32 p[4], r[4];
    if constexpr (NATURAL) {
      natural<T>(word(q[0], i), c.zero[0][j], c.scale[0][j], p);
      natural<T>(word(q[1], i), c.zero[1][j], c.scale[1][j], r);
    } else {
      Split<T>::run(word(q[0], i), c.zero[0][j], c.scale[0][j], p);
      Split<T>::run(word(q[1], i), c.zero[1][j], c.scale[1][j], r);
    }
    a0[0] = p[0]; a0[1] = r[0]; a0[2] = p[1]; a0[3] = r[1];
    a1[0] = p[2]; a1[1] = r[2]; a1[2] = p[3]; a1[3] = r[3];
  }
};

// Y[col][row] = value + bias[row], where both are inside the output.
template <typename T>
__device__ __forceinline__ void store1(float value, int row, int col, int m, int n,
                                       const T* __restrict__ bias, T* __restrict__ y) {
  if (row < n && col < m) {
    const float b = bias ? Ty<T>::to_float(bias[row]) : 0.0f;
    y[(size_t)col * n + row] = Ty<T>::from_float(value + b);
  }
}

// Lane (g, t)'s four results: Y[col][row] for rows g, g + 8 and cols 2t, 2t + 1 of the tile.
template <typename T>
__device__ __forceinline__ void store(const float acc[4], int row0, int col0, int m, int n,
                                      const T* __restrict__ bias, T* __restrict__ y) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    store1<T>(acc[e], row0 + (e >> 1) * 8, col0 + (e & 1), m, n, bias, y);
  }
}

// ---- thread block clusters: the K splits of one output tile add up in shared memory ----------
// A kernel compiled with __cluster_dims__(1, 1, S) has the S blocks of one tile, one a K split,
// in one cluster; each reads the others' partial sums through distributed shared memory.

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
               ::: "memory");
}

// The float4 at `local` (this block's shared memory) in the shared memory of cluster block `rank`.
__device__ __forceinline__ float4 cluster_load(const float* local, u32 rank) {
  const u32 address = (u32)__cvta_generic_to_shared(local);
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

// ---- M <= 8: one 16-row tile a block, its K split over the block's warps ---------------
// Bandwidth-bound: what matters is how many weight bytes are in flight (Little's law: about
// 4 MB on an H200). Each warp keeps its next DEPTH chunks of weights in flight in a ring of
// register buffers whose roles rotate by unrolling (a copy between buffers would wait for the
// load in flight), and the activations of its next chunk (at most 8 rows of A, L1 or L2 hits:
// the mma's 8-column operand). With DEPTH 4 and 16
// warps an SM, 64 KB of weights an SM are in flight: a 4096 x 4096 weight is requested whole
// at the start. The warps' sums meet in shared memory; gridDim.z = SPLIT > 1 splits K over
// the blocks of a cluster as well.
template <typename T> struct Acts {
  uint4 x[4];

  // Row `arow` of A at k0 .. k0 + 31 (zeros past K).
  __device__ __forceinline__ void load(const T* __restrict__ arow, u32 k, u32 k0) {
    const uint4* p = reinterpret_cast<const uint4*>(arow + k0);
    if (k0 + 32 <= k) {  // every chunk but the last when K % 32 != 0: no predicates
#pragma unroll
      for (u32 i = 0; i < 4; ++i) x[i] = __ldg(p + i);
    } else {
#pragma unroll
      for (u32 i = 0; i < 4; ++i) {
        x[i] = k0 + 8 * i < k ? __ldg(p + i) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
};

template <typename T, int BLOCK>
__device__ __forceinline__ void gemv_chunk(float acc[2][4], const Chunk<T, BLOCK>& w, u32 k0,
                                           const Acts<T>& x) {
  const typename Chunk<T, BLOCK>::Consts c = w.consts(k0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 a0[4], a1[4], b[4];
    w.template frags<false>(i, c, a0, a1);
    split_acts(x.x[i], b);
    Ty<T>::mma(acc[0], a0, b[0], b[1]);
    Ty<T>::mma(acc[1], a1, b[2], b[3]);
  }
}

template <typename T, int BLOCK, int WARPS, int DEPTH, int SPLIT>
__device__ __forceinline__ void gemv(const T* __restrict__ a, const u8* __restrict__ b,
                                     const T* __restrict__ scales, const u8* __restrict__ zeros,
                                     const T* __restrict__ bias, T* __restrict__ y, int m, int n,
                                     int k) {
  static_assert(DEPTH % 2 == 0, "the activation buffers alternate with the chunk's parity");
  __shared__ __align__(16) float partial[WARPS][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16 + g;
  const Tile<T, BLOCK> tile(b, scales, zeros, n, k, row0);
  const int chunks = (tile.kp + CHUNK - 1) / CHUNK;
  const int per_split = (chunks + SPLIT - 1) / SPLIT;
  const int first = min(chunks, (int)blockIdx.z * per_split) + warp;
  const int last = min(chunks, ((int)blockIdx.z + 1) * per_split);
  const int count = first < last ? (last - first + WARPS - 1) / WARPS : 0;
  // Lanes whose column g is past M read row 0 of A: their column is never stored.
  const T* arow = a + (size_t)(g < m ? g : 0) * k;
  // The i-th chunk of this warp starts at k = (first + i WARPS) CHUNK + 32 t for this lane.
  auto start = [&](int i) { return (u32)((first + i * WARPS) * CHUNK + 32 * t); };
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  Chunk<T, BLOCK> w[DEPTH];
  Acts<T> x[2];
  if (count > 0) x[0].load(arow, k, start(0));  // first: not queued behind the weights
#pragma unroll
  for (int j = 0; j < DEPTH; ++j) {
    if (j < count) w[j].load(tile, start(j));
  }
  for (int base = 0; base < count; base += DEPTH) {
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {
      const int i = base + j;
      if (i < count) {
        if (i + 1 < count) x[(j + 1) & 1].load(arow, k, start(i + 1));
        gemv_chunk<T, BLOCK>(acc, w[j], start(i), x[j & 1]);
        if (i + DEPTH < count) w[j].load(tile, start(i + DEPTH));
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) partial[warp][lane][e] = acc[0][e] + acc[1][e];
  __syncthreads();
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (warp == 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int v = 0; v < WARPS; ++v) sum[e] += partial[v][lane][e];
    }
  }
  if constexpr (SPLIT > 1) {
    if (warp == 0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[0][lane][e] = sum[e];  // only this lane read it
    }
    cluster_sync();  // every block's sums are written
    if (blockIdx.z == 0 && warp == 0) {
#pragma unroll
      for (u32 r = 1; r < SPLIT; ++r) {
        const float4 v = cluster_load(&partial[0][lane][0], r);
        sum[0] += v.x; sum[1] += v.y; sum[2] += v.z; sum[3] += v.w;
      }
      store<T>(sum, row0, 2 * t, m, n, bias, y);
    }
    cluster_sync();  // no block leaves while its sums may still be read
  } else {
    if (warp == 0) store<T>(sum, row0, 2 * t, m, n, bias, y);
  }
}

// ---- M > 8: 16 WARPS rows x BM columns a block, A staged in shared memory ----------------------
// Each warp owns 16 rows of W (its weights go straight to registers, DEPTH chunks ahead, as in
// the GEMV) and all BM columns; the block's BM rows of A go through a ring of STAGES shared-memory
// buffers that cp.async fills STAGES - 1 chunks ahead, one __syncthreads a chunk. A stage row
// holds its 128 k in 16 slots of 16 bytes without padding, slot 4 i + t holding k = 32 t + 8 i
// .. + 7 (the bytes lane (g, t) reads for word i), XOR-ed with 4 on odd rows: the eight lanes of
// each phase of a 16-byte shared load (rows g, g + 1, t = 0..3) then hit all 32 banks once.
// gridDim.z = SPLIT > 1 splits K over the blocks of a cluster, whose partial sums meet through
// distributed shared memory (the stages' memory, once they are drained).
constexpr int ROW_WORDS = CHUNK / 2;  // 32-bit words of a stage row (128 k of T)

template <int BM> struct StagePlan {
  static constexpr int STAGES = BM >= 64 ? 3 : 4;  // 48 KB, 32 KB, 16 KB of static shared memory
  static constexpr int WORDS = BM * ROW_WORDS;
};

__device__ __forceinline__ int slot_of(int row, int slot) { return slot ^ ((row & 1) << 2); }

__device__ __forceinline__ void cp_async16(u32* dst, const void* src, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  const int size = valid ? 16 : 0;  // 0: fill with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// Thread i copies slot i % 16 of rows i / 16 + j THREADS / 16, at 32-bit element offsets from A
// (knopt/cuda/w4a16.py refuses A of 2^31 elements or more) stepped by a constant; rows THREADS /
// 16 apart share their parity, so the destinations step by a constant too. Stages wholly inside
// A (all but the last row tile and K's last chunk) copy without predicates.
template <typename T, int BM, int THREADS>
__device__ __forceinline__ void stage_a(u32* stage, const T* __restrict__ a, int m0, int m,
                                        int k, int kc) {
  static_assert(BM * 16 % THREADS == 0 && THREADS % 32 == 0, "whole passes of even rows");
  constexpr int ROWS = THREADS / 16;  // rows a pass
  const int row = threadIdx.x / 16, slot = threadIdx.x % 16;
  const int kk = kc + 32 * (slot & 3) + 8 * (slot >> 2);
  const u32 offset = (u32)(m0 + row) * (u32)k + (u32)kk;
  const u32 step = (u32)ROWS * (u32)k;
  u32* dst = stage + row * ROW_WORDS + slot_of(row, slot) * 4;
  if (m0 + BM <= m && kc + CHUNK <= k) {
#pragma unroll
    for (int j = 0; j < BM / ROWS; ++j) {
      cp_async16(dst + j * ROWS * ROW_WORDS, a + (offset + j * step), true);
    }
  } else {
#pragma unroll
    for (int j = 0; j < BM / ROWS; ++j) {
      const bool valid = kk < k && m0 + row + j * ROWS < m;
      cp_async16(dst + j * ROWS * ROW_WORDS, valid ? a + (offset + j * step) : a, valid);
    }
  }
}

template <typename T, int BLOCK, int WARPS, int BM, int DEPTH, int SPLIT>
__device__ __forceinline__ void gemm(const T* __restrict__ a, const u8* __restrict__ b,
                                     const T* __restrict__ scales, const u8* __restrict__ zeros,
                                     const T* __restrict__ bias, T* __restrict__ y, int m, int n,
                                     int k) {
  constexpr int MT = BM / 8;  // 8-column tiles
  constexpr int STAGES = StagePlan<BM>::STAGES;
  constexpr int WORDS = StagePlan<BM>::WORDS;
  constexpr int THREADS = 32 * WARPS;
  static_assert(WARPS * MT * 32 * 4 <= STAGES * WORDS, "the partial sums fit in the stages");
  __shared__ __align__(16) u32 smem[STAGES * WORDS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16 * WARPS + 16 * warp + g;
  const int m0 = blockIdx.y * BM;
  const Tile<T, BLOCK> tile(b, scales, zeros, n, k, row0);
  const int chunks = (tile.kp + CHUNK - 1) / CHUNK;
  const int per_split = (chunks + SPLIT - 1) / SPLIT;
  const int first = min(chunks, (int)blockIdx.z * per_split);
  const int count = min(chunks, first + per_split) - first;
  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count) stage_a<T, BM, THREADS>(smem + s * WORDS, a, m0, m, k, (first + s) * CHUNK);
    cp_async_commit();  // empty groups too: group i always holds chunk i
  }
  Chunk<T, BLOCK> w[DEPTH];
#pragma unroll
  for (int j = 0; j < DEPTH; ++j) {
    if (j < count) w[j].load(tile, (u32)((first + j) * CHUNK + 32 * t));
  }
  for (int base = 0; base < count; base += DEPTH) {
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {
      const int i = base + j;
      if (i < count) {
        cp_async_wait<STAGES - 2>();  // chunk i's stage, as far as this thread copied it
        __syncthreads();              // ... and every thread; chunk i - 1's stage is free
        const int refill = i + STAGES - 1;
        if (refill < count) {
          stage_a<T, BM, THREADS>(smem + (refill % STAGES) * WORDS, a, m0, m, k,
                                  (first + refill) * CHUNK);
        }
        cp_async_commit();
        const u32* rows = smem + (i % STAGES) * WORDS + g * ROW_WORDS;
        const typename Chunk<T, BLOCK>::Consts c =
            w[j].consts((u32)((first + i) * CHUNK + 32 * t));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          u32 a0[4], a1[4];
          w[j].template frags<true>(q, c, a0, a1);
          const int slot = slot_of(g, 4 * q + t) * 4;  // rows g + 8 mt share g's parity
          // Every column tile, past M too (zeros): a predicate a tile costs more than the
          // mmas it spares, which only the last row tile of A has.
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const uint4 x = *reinterpret_cast<const uint4*>(rows + mt * 8 * ROW_WORDS + slot);
            Ty<T>::mma(acc[mt], a0, x.x, x.y);
            Ty<T>::mma(acc[mt], a1, x.z, x.w);
          }
        }
        if (i + DEPTH < count) w[j].load(tile, (u32)((first + i + DEPTH) * CHUNK + 32 * t));
      }
    }
  }
  if constexpr (SPLIT == 1) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) store<T>(acc[mt], row0, m0 + mt * 8 + 2 * t, m, n, bias, y);
  } else {
    // Partial sums as float4 units: unit (warp, mt, lane) holds lane's acc[mt] of that warp.
    cp_async_wait<0>();
    __syncthreads();  // the stages are drained and read: their memory holds the sums now
    float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      *reinterpret_cast<float4*>(sums + 4 * ((warp * MT + mt) * 32 + lane)) =
          make_float4(acc[mt][0], acc[mt][1], acc[mt][2], acc[mt][3]);
    }
    cluster_sync();
    // Block z of the cluster adds up and stores units [z U / SPLIT, (z + 1) U / SPLIT).
    constexpr int UNITS = WARPS * MT * 32;
    static_assert(UNITS % SPLIT == 0, "the units divide among the cluster's blocks");
    const int begin = blockIdx.z * (UNITS / SPLIT), end = begin + UNITS / SPLIT;
    for (int u = begin + threadIdx.x; u < end; u += THREADS) {
      float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (u32 r = 0; r < SPLIT; ++r) {
        const float4 v = cluster_load(sums + 4 * u, r);
        total.x += v.x; total.y += v.y; total.z += v.z; total.w += v.w;
      }
      const int unit_lane = u & 31, mt = (u >> 5) % MT, unit_warp = (u >> 5) / MT;
      const int row = blockIdx.x * 16 * WARPS + 16 * unit_warp + (unit_lane >> 2);
      const float values[4] = {total.x, total.y, total.z, total.w};
      store<T>(values, row, m0 + mt * 8 + 2 * (unit_lane & 3), m, n, bias, y);
    }
    cluster_sync();  // no block leaves while its sums may still be read
  }
}

// ---- the weight in T, for a library GEMM: W[n, k] (row-major, K a row) ------------------------
// One thread a 16-byte piece of codes (32 k of one row), written as four 16-byte pieces of T in
// natural order.
template <typename T, int BLOCK>
__device__ __forceinline__ void dequantize(const u8* __restrict__ b, const T* __restrict__ scales,
                                           const u8* __restrict__ zeros, T* __restrict__ w, int n,
                                           int k) {
  const int blocks = (k + BLOCK - 1) / BLOCK;
  const int pieces_a_row = blocks * BLOCK / 32;
  const size_t pieces = (size_t)n * pieces_a_row;
  const unsigned short* scale_bits = reinterpret_cast<const unsigned short*>(scales);
  for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < pieces;
       p += (size_t)gridDim.x * blockDim.x) {
    const size_t row = p / pieces_a_row;
    const int k0 = (int)(p % pieces_a_row) * 32;
    const uint4 codes = __ldcs(reinterpret_cast<const uint4*>(b) + p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int kk = k0 + 8 * i;
      const int blk = kk / BLOCK;
      const u32 scale = (u32)scale_bits[row * blocks + blk] * 0x00010001u;
      const u32 zero =
          zeros ? (zeros[row * ((blocks + 1) / 2) + (blk >> 1)] >> ((blk & 1) * 4)) & 15u : 8u;
      u32 pairs[4];
      natural<T>(word(codes, i), zero, scale, pairs);
      if (kk < k) {
        *reinterpret_cast<uint4*>(w + row * k + kk) =
            make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
      }
    }
  }
}

}  // namespace w4
