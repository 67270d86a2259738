// codegen/iota.cu: 0, 1, ..., n - 1.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(@T@* __restrict__ out) {
  KN_PDL_BEGIN();
  const long long i = (long long)blockIdx.x * @THREADS@ + threadIdx.x;
  if (i < @COUNT@) out[i] = @VALUE@;
}
