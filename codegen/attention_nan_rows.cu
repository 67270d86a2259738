// codegen/attention_nan_rows.cu: after cuDNN's fused attention, NaN over every output row whose
// bias row is all -inf (a softmax over no keys), as the CPU oracle and knopt's own attention
// kernels give; cuDNN writes 0 there. One warp a row of the bias, whose broadcast axes have
// size 1: a row that hides every key writes NaN over each output row it is broadcast to.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@(const @T@* __restrict__ bias, @T@* __restrict__ out) {
  KN_PDL_BEGIN();
  const long long row = ((long long)blockIdx.x * @THREADS@ + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= @BIAS_ROWS@) return;  // a whole warp: rows are warp-uniform
  const long long bb = row / (@BIAS_HEADS@ * @BIAS_QROWS@);
  const long long bh = row / @BIAS_QROWS@ % @BIAS_HEADS@;
  const long long bs = row % @BIAS_QROWS@;
  const @T@* b = bias + bb * @BIAS_SB@ + bh * @BIAS_SH@ + bs * @BIAS_SS@;
  bool open = false;
  for (long long t = lane; t < @KEYS@; t += 32) open |= kn::cvt<float>(b[t * @BIAS_ST@]) != -KN_INF_F;
  if (__any_sync(0xffffffffu, open)) return;
  const long long b0 = @BIAS_BATCH@ == 1 ? 0 : bb, b1 = @BIAS_BATCH@ == 1 ? @BATCH@ : bb + 1;
  const long long h0 = @BIAS_HEADS@ == 1 ? 0 : bh, h1 = @BIAS_HEADS@ == 1 ? @HEADS@ : bh + 1;
  const long long s0 = @BIAS_QROWS@ == 1 ? 0 : bs, s1 = @BIAS_QROWS@ == 1 ? @QROWS@ : bs + 1;
  const @T@ nan = kn::cvt<@T@>(KN_NAN_F);
  for (long long i = b0; i < b1; ++i)
    for (long long h = h0; h < h1; ++h)
      for (long long s = s0; s < s1; ++s)
        for (long long e = lane; e < @COLS@; e += 32)
          out[i * @OUT_SB@ + h * @OUT_SH@ + s * @OUT_SS@ + e * @OUT_SE@] = nan;
}
