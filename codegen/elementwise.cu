// codegen/elementwise.cu: one fused elementwise body over strided loads.
// Each thread writes VEC consecutive elements of the (contiguous) output; inputs whose last
// axis is dense are read with one VEC-wide access, broadcast ones once, others element-wise.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@PARAMS@) {
  KN_PDL_BEGIN();
  typedef @INDEX@ idx_t;
  const idx_t group = (idx_t)blockIdx.x * @THREADS@ + (idx_t)threadIdx.x;
  if (group >= @GROUPS@) return;
  const idx_t first = group * @VEC@;
@OFFSETS@
@WIDE_LOADS@
  kn::Vec<@OUT_T@, @VEC@> result;
#pragma unroll
  for (int v = 0; v < @VEC@; ++v) {
@VALUES@
@BODY@
    result.v[v] = @RESULT@;
  }
  *reinterpret_cast<kn::Vec<@OUT_T@, @VEC@>*>(out + first) = result;
}
