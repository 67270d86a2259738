// codegen/copy_rows.cu: copy `count` strided 4-D blocks of n0 x n1 x n2 x n3 elements from src
// to dst (resident key/value caches). Every size and stride is a launch argument, so one kernel
// serves every size. When `pos` is not null, the destination starts `*pos` rows further along
// (`row_stride` elements a row): the row a decoding step's keys move to is read from device
// memory, so one captured CUDA graph serves every step of a bucket.
extern "C" __global__ void __launch_bounds__(256) @NAME@(
    @T@* dst, const @T@* src, const int* __restrict__ pos,
    const long long n0, const long long n1, const long long n2, const long long n3,
    const long long count,
    const long long s0, const long long s1, const long long s2, const long long s3,
    const long long src_slot,
    const long long d0, const long long d1, const long long d2, const long long d3,
    const long long dst_slot, const long long row_stride) {
  KN_PDL_BEGIN();
  const long long total = count * n0 * n1 * n2 * n3;
  const long long start = (long long)blockIdx.x * 256 + threadIdx.x;
  const long long shift = pos != nullptr ? (long long)(*pos) * row_stride : 0;
  for (long long i = start; i < total; i += (long long)gridDim.x * 256) {
    long long rest = i;
    const long long c3 = rest % n3;
    rest /= n3;
    const long long c2 = rest % n2;
    rest /= n2;
    const long long c1 = rest % n1;
    rest /= n1;
    const long long c0 = rest % n0;
    const long long slot = rest / n0;
    dst[shift + slot * dst_slot + c0 * d0 + c1 * d1 + c2 * d2 + c3 * d3] =
        src[slot * src_slot + c0 * s0 + c1 * s1 + c2 * s2 + c3 * s3];
  }
}
