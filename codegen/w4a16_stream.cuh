// codegen/w4a16_stream.cuh: the stream GEMV, Y = A @ W^T + bias for M <= 4 rows of A, on the
// CUDA cores, for an int4 weight in MatMulNBits' layout (codegen/w4a16.cuh describes it and the
// dequantization used here). Built to stream the weight with little fixed cost a launch:
//   * each warp owns R consecutive rows of W (output features) and one of SPLIT parts of K
//     (the rounds below, dealt out in turn: round t to part t % SPLIT, each part a warp of the
//     same block): lane l reads 16 bytes (32 codes) of each row a load, its piece of round t at
//     k = 32 (l + 32 t), so one load of the warp is 512 contiguous bytes of a row, bypassing L1
//     (each code is read once). U pieces of every row are in flight a lane, in a ring of
//     register buffers whose roles rotate by unrolling (as in the mma GEMV: a copy between
//     buffers would wait for the load);
//   * A (C rows; rows past M repeat row 0 and are never stored) comes through the read-only
//     path: the warps of an SM read the same K halves, L1 hits after the first; one 16-byte
//     load of A serves the R rows. AHEAD puts A's pieces in the ring too, loaded with the
//     codes they meet, instead of just before their use;
//   * each weight is dequantized to T as every W4A16 kernel does it ((code - zero) * scale,
//     rounded once; "split" pairs) and multiplied by A in T's paired FMAs: the products of one
//     piece are summed in T, 8 a half (two chains: even and odd words), then in fp32;
//   * the lanes' sums meet by warp shuffles, then (SPLIT > 1) the parts' in shared memory, in
//     part order, after one barrier: no atomic, no second pass;
//   * EARLY (the kernel opens with KN_PDL_OPEN(true), codegen/common.cuh): the ring's first U
//     pieces of codes, scales and zero points are loaded before the wait for the kernel ahead,
//     so they stream in while it finishes; A, the bias and Y are touched only after it. Only
//     for a weight no kernel writes (knopt/cuda/w4a16.py: StreamConfig.early).
// Needs K % 8 == 0 and K_pad % 32 == 0, as the mma kernels (knopt/cuda/w4a16.py checks both).
#pragma once
#include "w4a16.cuh"

namespace w4 {

__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

// Where a lane's first piece of each of a warp's R rows lies, as pointers: its 16 bytes of
// codes, its block's scale (both blocks' for blocks of 16: k / 16 is even, so one aligned
// word), and the byte holding its zero point (if `zeros`). The first piece is that of round
// `round` (k = 32 (lane + 32 round)), or the row's first when that lies past the row: such a
// lane has no piece inside the row in this part and rereads one inside it against zero
// activations. Each round lies 1024 codes further, 1024 / BLOCK blocks: an even number for
// every block size, so whole bytes of zero points, and the zero point's nibble is the same in
// every piece of the lane. A row past N points at row `first` (inside N) instead and feeds
// only outputs that are never stored.
template <int BLOCK, int R> struct Rows {
  static constexpr int SCALES = 1024 / BLOCK;  // scales (and blocks) a round further
  const uint4* code[R];
  const unsigned short* scale[R];
  const u8* zero[R];  // (the codes when there are no zero points: never read)
  bool zeros;
  u32 nibble;  // the zero point's shift in its byte (0 or 4; for blocks of 16, the first's: 0)

  __device__ Rows(const u8* codes, const void* scales, const u8* zeros, int n, int k, int first,
                  int lane, int round)
      : zeros(zeros != nullptr) {
    const u32 blocks = ((u32)k + BLOCK - 1) / BLOCK;
    const u32 kp = blocks * BLOCK;
    const u32 wanted = (u32)lane + 32u * round;         // the piece, in 32-code units
    const u32 piece = 32u * wanted < kp ? wanted : 0u;  // past the row: the row's first
    const u32 blk = 32u * piece / BLOCK;                // the piece's first block
    nibble = (blk & 1u) * 4u;
    const unsigned short* s = reinterpret_cast<const unsigned short*>(scales);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const u32 row = first + r < n ? first + r : first;
      code[r] = reinterpret_cast<const uint4*>(codes + (row * (kp / 2) + 16u * piece));
      scale[r] = s + (row * blocks + blk);
      zero[r] = zeros ? zeros + (row * ((blocks + 1) / 2) + blk / 2) : codes;
    }
  }

  // The pointers `rounds` rounds further.
  __device__ __forceinline__ void advance(int rounds) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      code[r] += 32 * rounds;
      scale[r] += SCALES * rounds;
      zero[r] += SCALES / 2 * rounds;
    }
  }
};

// One lane's piece of each row: 32 codes, the bits of their scale (both blocks', the first low,
// for blocks of 16) and the byte holding their zero point (0x88 when there are none: 8).
template <int BLOCK, int R> struct Piece {
  uint4 q[R];
  u32 scale[R];
  u32 zero[R];

  // The piece `i` rounds past the pointers' of each row (i a constant after unrolling, an
  // immediate offset in every load).
  __device__ __forceinline__ void load(const Rows<BLOCK, R>& rows, int i) {
    constexpr int S = Rows<BLOCK, R>::SCALES;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q[r] = kn::load_once(rows.code[r] + 32 * i);
      if constexpr (BLOCK == 16) {
        scale[r] = __ldg(reinterpret_cast<const u32*>(rows.scale[r] + S * i));
      } else {
        scale[r] = (u32)__ldg(rows.scale[r] + S * i);
      }
      zero[r] = rows.zeros ? (u32)__ldg(rows.zero[r] + S / 2 * i) : 0x88u;
    }
  }
};

// A lane's activations of one piece: 32 k of each of the C rows of A from `p[c]` + 1024 i (k0
// of the piece), zeros from `left` (K less k0) on. `inside`: the piece lies inside K.
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

// The warp's sum of each output a lane: lane r C + c gets row r, column c (of R C <= 32).
template <int R, int C> __device__ __forceinline__ float lane_sums(const float acc[R][C]) {
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
  return mine;
}

// The sums of the SPLIT warps (parts of K) of each row group, added in part order in shared
// memory after one barrier every warp of the block reaches; part 0 stores Y[c][first + r].
template <typename T, int R, int C, int WARPS, int SPLIT>
__device__ __forceinline__ void split_store(const float acc[R][C], int first, int m, int n,
                                            const T* __restrict__ bias, T* __restrict__ y) {
  __shared__ float partial[WARPS][R * C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float mine = lane_sums<R, C>(acc);
  if (lane < R * C) partial[warp][lane] = mine;
  __syncthreads();
  if (warp % SPLIT == 0 && lane < R * C) {
#pragma unroll
    for (int p = 1; p < SPLIT; ++p) mine += partial[warp + p][lane];
    store1<T>(mine, first + lane / C, lane % C, m, n, bias, y);
  }
}

// One slot of the ring: a piece of each row, and with AHEAD the activations it meets.
template <typename T, int BLOCK, int R, int C, bool AHEAD> struct Slot {
  Piece<BLOCK, R> w;
  PieceActs<T, C> x;
};

// A warp's part of K into `acc`: its rounds (`part`, `part` + SPLIT, ...) of the lane's
// pieces: the whole ones, then, if the part has the last, partial round (K_pad not a multiple
// of 1024), that one, whose pieces past the row (lanes from pieces % 32 on) reread the lane's
// first piece, against zero activations. Pieces go through the ring at immediate offsets from
// pointers that step U of the part's rounds a turn.
template <typename T, int BLOCK, int C, int R, int U, int SPLIT, bool AHEAD, bool EARLY>
__device__ __forceinline__ void stream_part(float acc[R][C], const T* __restrict__ a,
                                            const u8* __restrict__ b,
                                            const T* __restrict__ scales,
                                            const u8* __restrict__ zeros, int m, int n, int k,
                                            int first, int part) {
  const int lane = threadIdx.x & 31;
  Rows<BLOCK, R> rows(b, scales, zeros, n, k, first, lane, part);
  const T* arow[C];  // A at the lane's first piece; rows past M repeat row 0
#pragma unroll
  for (int c = 0; c < C; ++c) {
    arow[c] = a + (size_t)(c < m ? c : 0) * k + 32 * lane + 1024 * part;
  }
  const int pieces = (k + BLOCK - 1) / BLOCK * BLOCK / 32;  // of each row
  const int full = pieces / 32, count = full + (pieces % 32 ? 1 : 0);  // rounds of all parts
  const int whole = full > part ? (full - part + SPLIT - 1) / SPLIT : 0;     // the part's whole
  const int rounds = count > part ? (count - part + SPLIT - 1) / SPLIT : 0;  // and all rounds
  const int last = lane < pieces % 32 ? whole : 0;  // the lane's piece in a last, partial round
  const int left = k - 32 * lane - 1024 * part;     // k from the lane's first piece to K
  // The part's round `base + j` into `s`, the pointers being at its round `base`.
  auto fill = [&](Slot<T, BLOCK, R, C, AHEAD>& s, int base, int j) {
    const int i = base + j;
    if (i < whole) {
      s.w.load(rows, SPLIT * j);
    } else if (i < rounds) {
      s.w.load(rows, SPLIT * (last - base));
    }
    if (AHEAD && i < rounds) {
      s.x.load(arow, SPLIT * j, left - 1024 * SPLIT * i, left >= 1024 * SPLIT * i + 32);
    }
  };
  Slot<T, BLOCK, R, C, AHEAD> ring[U];
#pragma unroll
  for (int j = 0; j < U; ++j) fill(ring[j], 0, j);
  if constexpr (EARLY) KN_PDL_WAIT();  // A (AHEAD is off) and Y only from here on
  for (int base = 0; base < rounds; base += U) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int i = base + j;
      if (i < rounds) {
        if (!AHEAD) {
          ring[j].x.load(arow, SPLIT * j, left - 1024 * SPLIT * i,
                         left >= 1024 * SPLIT * i + 32);
        }
        stream_piece<T, BLOCK, R, C>(acc, ring[j].w, ring[j].x, rows.nibble);
        fill(ring[j], base, j + U);
      }
    }
    rows.advance(SPLIT * U);  // the next U rounds of the part
#pragma unroll
    for (int c = 0; c < C; ++c) arow[c] += 1024 * SPLIT * U;
  }
}

// Y = A @ W^T + bias: R rows of W a row group of SPLIT warps, WARPS / SPLIT groups a block.
template <typename T, int BLOCK, int C, int R, int U, int WARPS, int SPLIT, bool AHEAD,
          bool EARLY>
__device__ __forceinline__ void stream_gemv(const T* __restrict__ a, const u8* __restrict__ b,
                                            const T* __restrict__ scales,
                                            const u8* __restrict__ zeros,
                                            const T* __restrict__ bias, T* __restrict__ y, int m,
                                            int n, int k) {
  static_assert(R * C <= 32, "a lane stores each of the warp's outputs");
  static_assert(WARPS % SPLIT == 0, "a block holds whole row groups");
  static_assert(!(EARLY && AHEAD), "activations are never read before the wait");
  const int warp = threadIdx.x >> 5;
  const int first = (blockIdx.x * (WARPS / SPLIT) + warp / SPLIT) * R;
  float acc[R][C] = {};
  if constexpr (SPLIT == 1) {
    if (first >= n) return;  // no barrier follows: a warp past N leaves whole
    stream_part<T, BLOCK, C, R, U, 1, AHEAD, EARLY>(acc, a, b, scales, zeros, m, n, k, first, 0);
    const int lane = threadIdx.x & 31;
    const float mine = lane_sums<R, C>(acc);
    if (lane < R * C) store1<T>(mine, first + lane / C, lane % C, m, n, bias, y);
  } else {
    if (first < n) {  // a group past N still reaches the barrier (and stores nothing)
      stream_part<T, BLOCK, C, R, U, SPLIT, AHEAD, EARLY>(acc, a, b, scales, zeros, m, n, k, first,
                                                   warp % SPLIT);
    }
    split_store<T, R, C, WARPS, SPLIT>(acc, first, m, n, bias, y);
  }
}

}  // namespace w4
