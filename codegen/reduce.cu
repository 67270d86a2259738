// codegen/reduce.cu: Reduce with a fused prologue (what is reduced) and epilogue (what is
// written). ROWS=1: a block per output, threads striding over the reduced elements, then a
// block reduction (for reductions over the fastest axis). ROWS=0: a thread per output, looping
// over the reduced elements (coalesced when the fastest axis is kept).
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
#if @ROWS@
  __shared__ @ACC_T@ scratch[32];
  const idx_t m = (idx_t)blockIdx.x;
#else
  const idx_t m = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (m >= @OUTPUTS@) return;
#endif
@KEPT@
  @ACC_T@ acc = @IDENTITY@;
#if @ROWS@
  for (idx_t j = threadIdx.x; j < @COUNT@; j += @THREADS@) {
#else
  for (idx_t j = 0; j < @COUNT@; ++j) {
#endif
@REDUCED@
    acc = @OP@()(acc, (@ACC_T@)(@VALUE@));
  }
#if @ROWS@
  acc = kn::block_reduce(acc, @OP@(), (@ACC_T@)(@IDENTITY@), scratch);
  if (threadIdx.x != 0) return;
#endif
  const auto a = @ACC_VALUE@;
@EPILOGUE@
  out[m] = @RESULT@;
}
