// codegen/tf32_split.cu: one f32 GEMM operand split for 3xTF32 (knopt/cuda/gen/split.py).
// Each thread reads one element x, keeps hi = x rounded to TF32 and lo = x - hi (exact in f32),
// and writes FIRST, SECOND and THIRD (each hi or lo) at PART-apart places of the dense output.
// Non-finite x is hi (lo 0); hi rounded past the f32 range falls back to x truncated.
extern "C" __global__ void __launch_bounds__(@THREADS@)
    @NAME@(float* __restrict__ out, const float* __restrict__ in0) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t i = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (i >= @COUNT@) return;
@COORDS@
  const float x = in0[@IN_OFFSET@];
  float hi = x;
  float lo = 0.0f;
  if (isfinite(x)) {
    unsigned int bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
    hi = __uint_as_float(bits);
    if (!isfinite(hi)) hi = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    lo = x - hi;
  }
  const idx_t o = @OUT_OFFSET@;
  out[o] = @FIRST@;
  out[o + (idx_t)@PART@] = @SECOND@;
  out[o + 2 * (idx_t)@PART@] = @THIRD@;
}
