// codegen/attention.cuh: what the attention kernels (attention*.cu) share: the split of a head
// index over three leading axes, shared-memory tile loads, and the tensor-core primitives
// (cp.async, ldmatrix, mma.sync m16n8k16) as inline PTX, which need sm_80 or newer.
#pragma once
#include "common.cuh"

namespace kn {
namespace attn {

constexpr float LOG2E = 1.4426950408889634f;

// All attention kernels keep their tiles in this one dynamic shared array (the same
// declaration everywhere, since kernels share a translation unit).
extern __shared__ __align__(16) unsigned char smem[];

// The element offset of head `head` (row-major over sizes [heads / (n1 * n2), n1, n2]) in a
// tensor whose three leading axes have strides s0, s1, s2.
template <typename I>
__device__ __forceinline__ I head_offset(I head, int n1, int n2, I s0, I s1, I s2) {
  const I h2 = head % n2;
  const I rest = head / n2;
  return (rest / n1) * s0 + (rest % n1) * s1 + h2 * s2;
}

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes from global to shared memory without passing through registers; the bytes past
// `bytes` (all 16 when it is 0, and then nothing is read) are zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Rows [r0, r0 + ROWS) and columns [0, PADDED) of a strided matrix into shared memory with row
// pitch PITCH; rows at or past `r_end` and columns at or past COLS are zeros. VEC copies
// 16-byte chunks with cp.async (columns dense, rows and base 16-byte aligned, COLS % 8 == 0);
// otherwise every element is loaded alone, through the strides. 128 threads take part.
template <typename T, typename I, int ROWS, int COLS, int PADDED, int PITCH, bool VEC>
__device__ __forceinline__ void load_tile(T* dst, const T* __restrict__ src, I base, int r0,
                                          int r_end, I row_stride, I col_stride) {
  if constexpr (VEC) {
    constexpr int CHUNKS = PADDED / 8;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += 128) {
      const int r = i / CHUNKS;
      const int c = (i % CHUNKS) * 8;
      const int row = r0 + r;
      const bool inside = row < r_end && c < COLS;
      const T* from = inside ? src + base + row * row_stride + c : src;
      cp_async16(dst + r * PITCH + c, from, inside ? 16 : 0);
    }
  } else {
    for (int i = threadIdx.x; i < ROWS * PADDED; i += 128) {
      const int r = i / PADDED;
      const int c = i % PADDED;
      const int row = r0 + r;
      dst[r * PITCH + c] = (row < r_end && c < COLS)
                               ? src[base + row * row_stride + c * col_stride]
                               : cvt<T>(0.0f);
    }
  }
}

// Four 8x8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix l / 8
// and receives, of each matrix i, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 in r[i]
// (.trans: row and column swapped).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}

// d += a b for a 16x16 row-major A, a 16x8 column-major B and a 16x8 f32 D (PTX fragment
// layouts: with g = lane / 4 and c = 2 (lane % 4), a holds A[g][c..c+1], A[g+8][c..c+1],
// A[g][c+8..c+9], A[g+8][c+8..c+9]; b holds B[c..c+1][g], B[c+8..c+9][g]; d holds
// D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]).
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two floats rounded to one register, `lo` in the low half (the lower column).
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};

// The weight exp(m - top) of a partial result with running max m against the overall max
// `top`; a part that saw only -inf scores weighs 0 (not exp(-inf - -inf) = NaN).
__device__ __forceinline__ float rescale(float m, float top) {
  return m == -KN_INF_F ? 0.0f : exp2f((m - top) * LOG2E);
}

// The end of an attention launch whose keys are split over `splits` blocks per row tile
// (attention_mma.cu): every block has written its partials, and the last of a row tile's
// blocks to finish merges them into `out` (the threadfence reduction of the CUDA C++
// Programming Guide), so decoding takes one launch, not a second merging kernel. Per row and
// column, with each split's running max m_i, sum l_i and unnormalized output o_i:
// out = sum_i w_i o_i / sum_i w_i l_i, w_i = exp(m_i - max_i m_i). A row whose every key was
// -inf gives 0 / 0 = NaN, as the CPU does. The row tile's ticket (zero before the launch) is
// zero again after it, ready for the next launch and for CUDA graph replays.
template <int BM, int E, int EP, typename elem, typename idx_t>
__device__ __forceinline__ void merge_splits(elem* __restrict__ out, const float* ws_o,
                                             const float* ws_ml, int* tickets, idx_t ob,
                                             idx_t os, idx_t oe, idx_t head, int m0, int s_len,
                                             int heads, int splits) {
  __shared__ bool last;
  __threadfence();  // this block's partials reach L2 before its ticket is taken
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(tickets + blockIdx.x, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const idx_t rows = (idx_t)heads * s_len;
  const int count = min(BM, s_len - m0) * E;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int row = m0 + i / E;
    const int e = i % E;
    const idx_t part = head * s_len + row;
    float overall = -KN_INF_F;
    for (int split = 0; split < splits; ++split)
      overall = fmaxf(overall, __ldcg(ws_ml + (split * rows + part) * 2));
    float total = 0.0f;
    float o = 0.0f;
    for (int split = 0; split < splits; ++split) {
      const idx_t at = split * rows + part;  // other blocks wrote these: read them from L2
      const float w = rescale(__ldcg(ws_ml + at * 2), overall);
      total += w * __ldcg(ws_ml + at * 2 + 1);
      o += w * __ldcg(ws_o + at * EP + e);
    }
    out[ob + row * os + e * oe] = kn::cvt<elem>(o / total);
  }
  if (threadIdx.x == 0) tickets[blockIdx.x] = 0;
}

}  // namespace attn
}  // namespace kn
