// codegen/rope.cu: rotary position embedding over the last axis, y = x * cos + rotate_half(x) *
// sin with rotate_half(x) = concat(-x[..., h:], x[..., :h]). A thread per pair (j, j + h): it
// reads x[j] and x[j + h] once, with cos and sin at both, and writes y[j] and y[j + h]. Every
// tensor is strided (views of the projections, broadcast tables); sizes are literals that
// knopt.cuda.generic lifts into launch arguments.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  typedef @C@ real;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @PAIRS@) return;
@COORDS@
@OFFSETS@
  const real lo = @X_LO@;
  const real hi = @X_HI@;
  out[o_out] = @Y_LO@;
  out[o_out + @OUT_HALF@] = @Y_HI@;
}
