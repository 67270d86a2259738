// codegen/scatter.cu: ScatterElements after out = data was copied: a thread per update writes
// (or combines atomically) its value at the index it names along one axis.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  long long g = (long long)in0[@INDEX_OFFSET@];
  if (g < 0) g += @SIZE@;
  if (g < 0 || g >= @SIZE@) return;
  const idx_t o = @OUT_OFFSET@;
  const @T@ u = in1[@UPDATE_OFFSET@];
@WRITE@
}
