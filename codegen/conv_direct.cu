// codegen/conv_direct.cu: N-d grouped convolution, a thread per output element. The fallback
// for dtypes and shapes cuDNN does not take (integers, more than 3 spatial axes). The output is
// dense, in row-major order (OUT_INDEX is i) or channels last.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  const idx_t group = c1 / @OUT_PER_GROUP@;
  @ACC_T@ acc = 0;
  for (idx_t ci = 0; ci < @IN_PER_GROUP@; ++ci) {
    const idx_t channel = group * @IN_PER_GROUP@ + ci;
@LOOPS@
  }
  out[@OUT_INDEX@] = @RESULT@;
}
