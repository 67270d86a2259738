// codegen/rowwise.cu: softmax, layernorm and rmsnorm over rows, a block per row, with a fused
// prologue (load) and epilogue (store). With CACHED the row stays in registers (up to CACHE
// values a thread) between the passes; otherwise each pass reads it again.
#define KN_SOFTMAX 0
#define KN_LAYER_NORM 1
#define KN_RMS_NORM 2

extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  typedef @C@ real;
  constexpr int kThreads = @THREADS@;
  // The row's length is a value, not a constant, so one kernel serves every length of a
  // symbolic axis; kCount bounds the values a thread keeps (guarded by j < kLength).
  const idx_t kLength = @LENGTH@;
#if @CACHED@
  constexpr int kCount = @CACHE@;
#else
  const int kCount = (int)((kLength + kThreads - 1) / kThreads);
#endif
  __shared__ real scratch[32];
  const idx_t row = (idx_t)blockIdx.x;
@OUTER@
  auto load = [&](idx_t j) -> real {
@LOAD@
  };
  auto store = [&](idx_t j, real value) {
@STORE@
  };
#if @CACHED@
  real v[kCount];
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    const idx_t j = (idx_t)threadIdx.x + (idx_t)c * kThreads;
    v[c] = j < kLength ? load(j) : real(0);
  }
#define KN_VALUE(c, j) v[c]
#else
#define KN_VALUE(c, j) load(j)
#endif
#define KN_FOR_ROW(BODY)                                                  \
  for (int c = 0; c < kCount; ++c) {                                      \
    const idx_t j = (idx_t)threadIdx.x + (idx_t)c * kThreads;             \
    if (j < kLength) { BODY }                                             \
  }
#if @OP@ == KN_SOFTMAX
  real top = -(real)KN_INF_D;
  KN_FOR_ROW(top = kn::max_(top, KN_VALUE(c, j));)
  top = kn::block_reduce(top, kn::MaxOp(), -(real)KN_INF_D, scratch);
  real total = 0;
  KN_FOR_ROW(total += kn::u_exp(KN_VALUE(c, j) - top);)
  total = kn::block_reduce(total, kn::SumOp(), real(0), scratch);
  KN_FOR_ROW(store(j, kn::u_exp(KN_VALUE(c, j) - top) / total);)
#elif @OP@ == KN_LAYER_NORM
  real total = 0;
  KN_FOR_ROW(total += KN_VALUE(c, j);)
  const real mean = kn::block_reduce(total, kn::SumOp(), real(0), scratch) / (real)kLength;
  real squares = 0;
  KN_FOR_ROW(const real d = KN_VALUE(c, j) - mean; squares += d * d;)
  const real var = kn::block_reduce(squares, kn::SumOp(), real(0), scratch) / (real)kLength;
  const real scale = kn::u_sqrt(var + (real)(@EPS@));
  KN_FOR_ROW(store(j, (KN_VALUE(c, j) - mean) / scale);)
#else
  real squares = 0;
  KN_FOR_ROW(const real x = KN_VALUE(c, j); squares += x * x;)
  const real ms = kn::block_reduce(squares, kn::SumOp(), real(0), scratch) / (real)kLength;
  const real scale = kn::u_sqrt(ms + (real)(@EPS@));
  KN_FOR_ROW(store(j, KN_VALUE(c, j) / scale);)
#endif
#undef KN_VALUE
#undef KN_FOR_ROW
}
