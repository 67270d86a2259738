// codegen/arg_reduce.cu: ArgMax/ArgMin along one axis, a thread per output. NaN counts as the
// extreme (numpy); ties go to the first index, or the last with LAST.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t m = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (m >= @OUTPUTS@) return;
@KEPT@
  @T@ best = @LOAD_FIRST@;
  long long best_index = 0;
  for (idx_t j = 1; j < @COUNT@; ++j) {
    const @T@ x = @LOAD_J@;
    if (@BETTER@) {
      best = x;
      best_index = j;
    }
  }
  out[m] = best_index;
}
