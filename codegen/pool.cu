// codegen/pool.cu: max or average pooling over N-d windows, a thread per output element.
// Padding never wins a max; an average counts real elements, plus the explicit padding when
// COUNT_PAD (ceil mode's extra positions never count).
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  @ACC_T@ acc = @INIT@;
  @ACC_T@ count = 0;
@LOOPS@
  out[i] = @RESULT@;
}
