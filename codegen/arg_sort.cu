// codegen/arg_sort.cu: a stable argsort by rank counting. The thread of element i counts the
// elements that sort before it (smaller, or equal with a smaller index) and writes i there.
// NaN sorts as the largest value, as in numpy. O(n^2) per row, but exact and race-free.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t t = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (t >= @TOTAL@) return;
  const idx_t m = t / @COUNT@;
  const idx_t i = t % @COUNT@;
@KEPT@
  const @T@ xi = @LOAD_I@;
  idx_t rank = 0;
  for (idx_t j = 0; j < @COUNT@; ++j) {
    const @T@ xj = @LOAD_J@;
    const bool before = @BEFORE_JI@;
    const bool after = @BEFORE_IJ@;
    rank += (before || (!after && j < i)) ? 1 : 0;
  }
  out[o + rank * (@OUT_STRIDE@)] = (long long)i;
}
