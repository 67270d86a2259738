// codegen/gather.cu: out[..., i..., ...] = x[..., indices[i...], ...] along one axis, a thread
// per output element. Negative indices wrap once; out-of-range ones are clamped, never read.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  long long g = (long long)in1[@INDEX_OFFSET@];
  if (g < 0) g += @SIZE@;
  g = g < 0 ? 0 : (g >= @SIZE@ ? @SIZE@ - 1 : g);
  out[i] = in0[@SOURCE_OFFSET@];
}
