// codegen/w4a16_stream.cuh: the stream GEMV, Y = A @ W^T + bias for M <= 4 rows of A, on the
// CUDA cores, for an int4 weight in MatMulNBits' layout (codegen/w4a16.cuh describes it and the
// dequantization used here). Built to stream the weight with little fixed cost a launch:
//   * each warp owns R consecutive rows of W (output features) and the whole of K: lane l reads
//     16 bytes (32 codes) of each row a load, its i-th piece at k = 32 (l + 32 i), so one load
//     of the warp is 512 contiguous bytes of a row, bypassing L1 (each code is read once). U
//     pieces of every row are in flight a lane, in a ring of register buffers whose roles rotate
//     by unrolling (as in the mma GEMV: a copy between buffers would wait for the load);
//   * A (C rows; rows past M repeat row 0 and are never stored) comes through the read-only
//     path: the warps of an SM read the same K halves, L1 hits after the first; one 16-byte
//     load of A serves the R rows;
//   * each weight is dequantized to T as every W4A16 kernel does it ((code - zero) * scale,
//     rounded once; "split" pairs) and multiplied by A in T's paired FMAs: the products of one
//     piece are summed in T, 8 a half (two chains: even and odd words), then in fp32;
//   * the lanes' sums meet by warp shuffles: no shared memory, barrier or atomic.
// Needs K % 8 == 0 and K_pad % 32 == 0, as the mma kernels (knopt/cuda/w4a16.py checks both).
#pragma once
#include "w4a16.cuh"

namespace w4 {

// 16 bytes of codes, read without allocating in L1 (which keeps A). Volatile: never speculated
// past the guard that keeps it inside the weight.
__device__ __forceinline__ uint4 load_once(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

// Where a lane's first piece of each of a warp's R rows lies, as pointers: its 16 bytes of
// codes (k = 32 lane), its block's scale (both blocks' for blocks of 16: k / 16 is even, so one
// aligned word), and the byte holding its zero point (if `zeros`). Piece i lies 1024 i codes
// further, 1024 / BLOCK blocks: an even number for every block size, so whole bytes of zero
// points, and the zero point's nibble is the same in every piece of the lane. A row past N
// points at row `first` (inside N) instead and feeds only outputs that are never stored.
template <int BLOCK, int R> struct Rows {
  static constexpr int SCALES = 1024 / BLOCK;  // scales (and blocks) a piece index further
  const uint4* code[R];
  const unsigned short* scale[R];
  const u8* zero[R];  // (the codes when there are no zero points: never read)
  bool zeros;
  u32 nibble;  // the zero point's shift in its byte (0 or 4; for blocks of 16, the first's: 0)

  __device__ Rows(const u8* codes, const void* scales, const u8* zeros, int n, int k, int first,
                  int lane)
      : zeros(zeros != nullptr) {
    const u32 blocks = ((u32)k + BLOCK - 1) / BLOCK;
    const u32 kp = blocks * BLOCK;
    const u32 blk = 32u * lane / BLOCK;  // the lane's first block
    nibble = (blk & 1u) * 4u;
    const unsigned short* s = reinterpret_cast<const unsigned short*>(scales);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const u32 row = first + r < n ? first + r : first;
      code[r] = reinterpret_cast<const uint4*>(codes + (row * (kp / 2) + 16u * lane));
      scale[r] = s + (row * blocks + blk);
      zero[r] = zeros ? zeros + (row * ((blocks + 1) / 2) + blk / 2) : codes;
    }
  }
};

// One lane's piece of each row: 32 codes, the bits of their scale (both blocks', the first low,
// for blocks of 16) and the byte holding their zero point (0x88 when there are none: 8).
template <int BLOCK, int R> struct Piece {
  uint4 q[R];
  u32 scale[R];
  u32 zero[R];

  // Piece i of each row (i a constant after unrolling, an immediate offset in every load).
  __device__ __forceinline__ void load(const Rows<BLOCK, R>& rows, int i) {
    constexpr int S = Rows<BLOCK, R>::SCALES;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q[r] = load_once(rows.code[r] + 32 * i);
      if constexpr (BLOCK == 16) {
        scale[r] = __ldg(reinterpret_cast<const u32*>(rows.scale[r] + S * i));
      } else {
        scale[r] = (u32)__ldg(rows.scale[r] + S * i);
      }
      zero[r] = rows.zeros ? (u32)__ldg(rows.zero[r] + S / 2 * i) : 0x88u;
    }
  }
};

// A lane's activations of one piece: 32 k of each of the C rows of A from `p[c]` (k0 of the
// piece), zeros from `left` (K less k0) on. `inside`: the piece lies inside K.
template <typename T, int C> struct PieceActs {
  uint4 x[C][4];

  __device__ __forceinline__ void load(const T* const p[C], int i, int left, bool inside) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const uint4* v = reinterpret_cast<const uint4*>(p[c] + 1024 * i);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        x[c][w] = inside || 8 * w < left ? __ldg(v + w) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
};

// acc[r][c] += the piece of row r times A[c] at the same k.
template <typename T, int BLOCK, int R, int C>
__device__ __forceinline__ void stream_piece(float acc[R][C], const Piece<BLOCK, R>& w,
                                             const PieceActs<T, C>& a, u32 nibble) {
  typedef typename Ty<T>::T2 T2;
  constexpr int SPL = BLOCK == 16 ? 2 : 1;  // blocks a piece meets
  u32 zero[R][SPL], scale[R][SPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int j = 0; j < SPL; ++j) {
      zero[r][j] = (w.zero[r] >> (nibble + 4u * j)) & 15u;
      if constexpr (BLOCK == 16) {
        scale[r][j] = __byte_perm(w.scale[r], 0u, j == 0 ? 0x1010 : 0x3232);
      } else {
        scale[r][j] = w.scale[r] * 0x00010001u;
      }
    }
  }
  T2 sum[2][R][C];  // by the word's parity
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 x[C][4];
#pragma unroll
    for (int c = 0; c < C; ++c) split_acts(a.x[c][i], x[c]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      u32 p[4];
      const int j = SPL == 2 ? i >> 1 : 0;
      Split<T>::run(word(w.q[r], i), zero[r][j], scale[r][j], p);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        T2& s = sum[i & 1][r][c];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const T2 wq = bits<T2>(p[q]), aq = bits<T2>(x[c][q]);
          s = i < 2 && q == 0 ? __hmul2(wq, aq) : __hfma2(wq, aq, s);  // a chain's first: s unset
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float2 even = to_float2(sum[0][r][c]), odd = to_float2(sum[1][r][c]);
      acc[r][c] += (even.x + even.y) + (odd.x + odd.y);
    }
  }
}

// The warp's sums added over its lanes; lane r C + c stores Y[c][first + r] (+ bias).
template <typename T, int R, int C>
__device__ __forceinline__ void stream_store(const float acc[R][C], int first, int m, int n,
                                             const T* __restrict__ bias, T* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  float mine = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float v = acc[r][c];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == r * C + c) mine = v;
    }
  }
  if (lane < R * C) store1<T>(mine, first + lane / C, lane % C, m, n, bias, y);
}

// Each lane's pieces: `full` rounds of the warp's 32 pieces inside every row, then when K_pad is
// not a multiple of 1024 a last round whose pieces past the row (lanes from pieces % 32 on)
// reread the lane's first piece, against zero activations. Pieces go through the ring at
// immediate offsets from pointers that step U pieces a turn.
template <typename T, int BLOCK, int C, int R, int U, int WARPS>
__device__ __forceinline__ void stream_gemv(const T* __restrict__ a, const u8* __restrict__ b,
                                            const T* __restrict__ scales,
                                            const u8* __restrict__ zeros,
                                            const T* __restrict__ bias, T* __restrict__ y, int m,
                                            int n, int k) {
  static_assert(R * C <= 32, "a lane stores each of the warp's outputs");
  const int lane = threadIdx.x & 31;
  const int first = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  if (first >= n) return;  // no barrier follows: a warp past N leaves whole
  Rows<BLOCK, R> rows(b, scales, zeros, n, k, first, lane);
  const T* arow[C];  // A at the lane's first piece; rows past M repeat row 0
#pragma unroll
  for (int c = 0; c < C; ++c) arow[c] = a + (size_t)(c < m ? c : 0) * k + 32 * lane;
  const int pieces = (k + BLOCK - 1) / BLOCK * BLOCK / 32;  // of each row
  const int full = pieces / 32;
  const int count = full + (pieces % 32 ? 1 : 0);  // rounds
  const int last = lane < pieces % 32 ? full : 0;  // the lane's piece in a last, partial round
  const int left = k - 32 * lane;                  // k from the lane's first piece to K
  // Piece `base + j` into `w`, the pointers being at piece `base`.
  auto fill = [&](Piece<BLOCK, R>& w, int base, int j) {
    if (base + j < full) {
      w.load(rows, j);
    } else if (base + j < count) {
      w.load(rows, last - base);
    }
  };
  float acc[R][C] = {};
  Piece<BLOCK, R> w[U];
#pragma unroll
  for (int j = 0; j < U; ++j) fill(w[j], 0, j);
  for (int base = 0; base < count; base += U) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int i = base + j;
      if (i < count) {
        PieceActs<T, C> x;
        x.load(arow, j, left - 1024 * i, left >= 1024 * i + 32);
        stream_piece<T, BLOCK, R, C>(acc, w[j], x, rows.nibble);
        fill(w[j], base, j + U);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // the next U pieces
      rows.code[r] += 32 * U;
      rows.scale[r] += Rows<BLOCK, R>::SCALES * U;
      rows.zero[r] += Rows<BLOCK, R>::SCALES / 2 * U;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) arow[c] += 1024 * U;
  }
  stream_store<T, R, C>(acc, first, m, n, bias, y);
}

}  // namespace w4
