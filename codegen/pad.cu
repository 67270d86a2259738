// codegen/pad.cu: grow each axis (constant, reflect, edge or wrap), a thread per output element.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  bool inside = true;
@SOURCE@
  out[i] = inside ? in0[@SOURCE_OFFSET@] : @VALUE@;
}
