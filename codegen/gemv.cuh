// codegen/gemv.cuh: the GEMV of codegen/gemv.cu, Y = alpha * A @ W + bias + residual for
// M <= COLS rows of A (a decoding step's linear layers) and a constant half-precision weight
// W [K, N], row-major as ONNX MatMul stores it, on the CUDA cores (knopt/cuda/gen/gemv.py
// plans it). Bandwidth-bound:
//   * a block owns TILE = 64 columns of W and, with the other SPLIT blocks of its cluster, all
//     of K. Its 256 threads are 32 k-lanes of 8 threads; a thread owns 8 columns (one 16-byte
//     load a row of W) and takes chunks of 8 rows of W, chunk c for k-lane g of the cluster
//     when c = g (mod 32 SPLIT), two chunks in flight (a ring of two, by unrolling);
//   * a chunk meets one 16-byte load of A a row of A (its 8 k), products summed in fp32;
//   * the k-lanes of a block meet in shared memory in a fixed order, then (SPLIT > 1) the
//     blocks of a cluster through distributed shared memory, each block finishing its share of
//     the columns: no atomics, the same sums every run;
//   * the epilogue (alpha, bias, residual) is applied in fp32 and rounded once;
//   * EARLY: the first two chunks of W are loaded before the wait for the kernel ahead
//     (KN_PDL_OPEN, codegen/common.cuh), so they stream in while it finishes; A, the residual
//     and Y only after it. W, like every weight knopt uploads, is never written.
// Needs K % 8 == 0, N % 8 == 0, A's rows and W 16-byte aligned (the planner checks).
#pragma once
#include "common.cuh"

namespace knv {

typedef unsigned int u32;
constexpr int LANES = 8;               // threads along a row of W
constexpr int TILE = 8 * LANES;        // columns a block
constexpr int THREADS = 256;
constexpr int KL = THREADS / LANES;    // k-lanes a block
constexpr int GROUPS = THREADS / TILE;  // threads a column while the k-lanes meet

template <typename T> struct Half;
template <> struct Half<__half> {
  static __device__ __forceinline__ float2 pair(u32 v) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
  static __device__ __forceinline__ float one(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half round(float x) { return __float2half_rn(x); }
};
template <> struct Half<__nv_bfloat16> {
  static __device__ __forceinline__ float2 pair(u32 v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  }
  static __device__ __forceinline__ float one(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 round(float x) { return __float2bfloat16_rn(x); }
};

__device__ __forceinline__ u32 word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Chunk `c` (rows 8c .. 8c + 7) of the thread's 8 columns, zeros past K or N.
template <typename T>
__device__ __forceinline__ void load_chunk(uint4 (&v)[8], const T* __restrict__ w, int c,
                                           int chunks, int col, int n) {
  if (c < chunks && col < n) {
    const uint4* p = reinterpret_cast<const uint4*>(w + (size_t)(8 * c) * n + col);
    const size_t row = (size_t)n / 8;
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = kn::load_once(p + r * row);
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// acc[m][j] += A[m][8c + r] * W[8c + r][col + j] over the chunk's rows r.
template <typename T, int COLS>
__device__ __forceinline__ void fma_chunk(float (&acc)[COLS][8], const uint4 (&v)[8],
                                          const T* __restrict__ a, int lda, int m, int c) {
  uint4 x[COLS];
#pragma unroll
  for (int i = 0; i < COLS; ++i) {
    x[i] = i < m ? __ldg(reinterpret_cast<const uint4*>(a + (size_t)i * lda + 8 * c))
                 : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    float wf[8];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 p = Half<T>::pair(word(v[r], q));
      wf[2 * q] = p.x;
      wf[2 * q + 1] = p.y;
    }
#pragma unroll
    for (int i = 0; i < COLS; ++i) {
      const float2 p = Half<T>::pair(word(x[i], r / 2));
      const float xr = r % 2 ? p.y : p.x;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(xr, wf[j], acc[i][j]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void store(float value, int i, int col, int n, float alpha,
                                      const T* __restrict__ bias, const T* __restrict__ residual,
                                      T* __restrict__ y) {
  float out = alpha * value;
  if (bias) out += Half<T>::one(bias[col]);
  if (residual) out += Half<T>::one(residual[(size_t)i * n + col]);
  y[(size_t)i * n + col] = Half<T>::round(out);
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
               ::: "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
  u32 rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The float at `local` (this block's shared memory) in the shared memory of cluster block `rank`.
__device__ __forceinline__ float cluster_load(const float* local, u32 rank) {
  const u32 address = (u32)__cvta_generic_to_shared(local);
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

template <typename T, int COLS, int SPLIT, bool EARLY>
__device__ __forceinline__ void gemv(const T* __restrict__ a, const T* __restrict__ w,
                                     const T* __restrict__ bias,
                                     const T* __restrict__ residual, T* __restrict__ y, int m,
                                     int n, int k, int lda, float alpha) {
  const int t = threadIdx.x;
  const int lane = t % LANES, kl = t / LANES;
  const int base = blockIdx.x * TILE;
  const int col = base + 8 * lane;
  const int rank = SPLIT > 1 ? (int)cluster_rank() : 0;
  const int step = SPLIT * KL;  // chunks between a k-lane's two
  const int chunks = k / 8;
  float acc[COLS][8] = {};
  uint4 w0[8], w1[8];
  int c = rank * KL + kl;
  load_chunk<T>(w0, w, c, chunks, col, n);
  load_chunk<T>(w1, w, c + step, chunks, col, n);
  if constexpr (EARLY) KN_PDL_WAIT();  // A, the residual and Y only from here on
  for (; c < chunks; c += 2 * step) {
    fma_chunk<T, COLS>(acc, w0, a, lda, m, c);
    load_chunk<T>(w0, w, c + 2 * step, chunks, col, n);
    if (c + step < chunks) {
      fma_chunk<T, COLS>(acc, w1, a, lda, m, c + step);
      load_chunk<T>(w1, w, c + 3 * step, chunks, col, n);
    }
  }

  // The block's k-lanes meet, a row of A at a time: 8 k-lanes a thread, then GROUPS a column.
  __shared__ __align__(16) float red[KL][TILE];
  __shared__ float part[GROUPS][TILE];
  __shared__ float mine[COLS][TILE];
  const int column = t % TILE, group = t / TILE;
#pragma unroll
  for (int i = 0; i < COLS; ++i) {
    if (i >= m) break;  // m is the same for every thread: the barriers stay uniform
    float4* dst = reinterpret_cast<float4*>(&red[kl][8 * lane]);
    dst[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    dst[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < KL / GROUPS; ++q) s += red[group * (KL / GROUPS) + q][column];
    part[group][column] = s;
    __syncthreads();
    if (t < TILE) {
      float total = 0.0f;
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) total += part[g][t];
      mine[i][t] = total;
    }
  }
  if constexpr (SPLIT == 1) {
    __syncthreads();
    for (int e = t; e < m * TILE; e += THREADS) {
      const int i = e / TILE, cx = base + e % TILE;
      if (cx < n) store<T>(mine[i][e % TILE], i, cx, n, alpha, bias, residual, y);
    }
  } else {
    // Block `rank` finishes columns rank * PER .. of the tile, adding the blocks' sums in order.
    constexpr int PER = TILE / SPLIT;
    cluster_sync();
    for (int e = t; e < m * PER; e += THREADS) {
      const int i = e / PER, cx = rank * PER + e % PER;
      float total = 0.0f;
#pragma unroll
      for (int q = 0; q < SPLIT; ++q) total += cluster_load(&mine[i][cx], (u32)q);
      if (base + cx < n) store<T>(total, i, base + cx, n, alpha, bias, residual, y);
    }
    cluster_sync();  // no block leaves while another still reads its shared memory
  }
}

}  // namespace knv
