// codegen/cumsum.cu: running sums along one axis, a thread per row (sequential, so the order
// of additions is numpy's).
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t m = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (m >= @ROWS@) return;
@KEPT@
  @ACC_T@ acc = 0;
  for (idx_t k = 0; k < @COUNT@; ++k) {
    const idx_t j = @REVERSE@ ? @COUNT@ - 1 - k : k;
    const @ACC_T@ x = (@ACC_T@)(@LOAD@);
#if @EXCLUSIVE@
    out[o + j * (@OUT_STRIDE@)] = @STORE@;
    acc += x;
#else
    acc += x;
    out[o + j * (@OUT_STRIDE@)] = @STORE@;
#endif
  }
}
