// codegen/matmul_direct.cu: batched matrix product, a thread per output element. The fallback
// for dtypes cuBLASLt does not take (integers, bool).
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  @ACC_T@ acc = 0;
  for (idx_t k = 0; k < @K@; ++k) {
    acc += (@ACC_T@)(@A@) * (@ACC_T@)(@B@);
  }
  out[i] = @RESULT@;
}
