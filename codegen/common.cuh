// codegen/common.cuh: scalar helpers shared by every knopt kernel template.
//
// The elementwise functions are named after the IR kinds (u_<unary>, b_<binary>, lowercase), so
// knopt.cuda.cexpr can name them without a table and a test can prove every kind has one.
// Their semantics follow the numpy oracle (knopt/cpu/elementwise.py): NaN propagates through
// min/max, integer division truncates, Python-style modulo, shifts past the width give 0.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace kn {

typedef long long i64;

#define KN_INF_F __int_as_float(0x7f800000)
#define KN_NAN_F __int_as_float(0x7fffffff)
#define KN_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define KN_NAN_D __longlong_as_double(0x7ff8000000000000LL)

// ---- programmatic dependent launch ---------------------------------------------------------

// The first statement of every kernel (tests/cuda/test_templates.py checks it). On sm_90 and
// later knopt launches its kernels with programmatic stream serialization (knopt/cuda/driver.py),
// so a kernel's blocks may start before the kernel ahead of it on the stream has finished.
// `griddepcontrol.wait` holds each thread until that kernel has completed and its writes are
// visible. Nothing may touch global memory before it: through arena reuse, this kernel's output
// may be a buffer the previous one still reads. `launch_dependents` then lets the next kernel's
// blocks be scheduled while this one runs; they wait in turn for this whole grid to complete, and
// a trigger only counts once every block of this grid has given it, so none of this grid's blocks
// waits for room behind them. Without the launch attribute both instructions do nothing; below
// sm_90 the macro is empty.
//
// A kernel that streams constants no kernel ever writes (a weight: knopt uploads those before
// the first launch and keeps them apart from the arena) may read them before it waits, so that
// their loads overlap the kernel ahead: it opens with KN_PDL_OPEN(true), which only lets the
// kernels behind start, and reaches KN_PDL_WAIT() before it touches any other memory.
// KN_PDL_OPEN(false) is KN_PDL_BEGIN().
#if __CUDA_ARCH__ >= 900
#define KN_PDL_BEGIN() \
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#define KN_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define KN_PDL_OPEN(early)                                                \
  do {                                                                    \
    if (early) {                                                          \
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");     \
    } else {                                                              \
      KN_PDL_BEGIN();                                                     \
    }                                                                     \
  } while (0)
#else
#define KN_PDL_BEGIN() ((void)0)
#define KN_PDL_WAIT() ((void)0)
#define KN_PDL_OPEN(early) ((void)0)
#endif

// 16 bytes of a weight, read once: through the read-only path without allocating in L1 (which
// keeps what is read again, such as activations). Volatile: never speculated past the guard that
// keeps it inside the weight, and kept in program order with KN_PDL_WAIT(). The PTX test
// recognises a weight load before the wait by this instruction.
__device__ __forceinline__ uint4 load_once(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---- type facts ------------------------------------------------------------------------

template <typename T> struct is_int { static constexpr bool value = false; };
template <> struct is_int<signed char> { static constexpr bool value = true; };
template <> struct is_int<short> { static constexpr bool value = true; };
template <> struct is_int<int> { static constexpr bool value = true; };
template <> struct is_int<long long> { static constexpr bool value = true; };
template <> struct is_int<unsigned char> { static constexpr bool value = true; };
template <> struct is_int<unsigned short> { static constexpr bool value = true; };
template <> struct is_int<unsigned int> { static constexpr bool value = true; };
template <> struct is_int<unsigned long long> { static constexpr bool value = true; };

template <typename T> struct is_float { static constexpr bool value = false; };
template <> struct is_float<float> { static constexpr bool value = true; };
template <> struct is_float<double> { static constexpr bool value = true; };

template <typename T> struct is_signed { static constexpr bool value = T(-1) < T(0); };

// ---- conversions -------------------------------------------------------------------------

// Floats go to integers through long long, so that out-of-range values wrap as numpy's do
// on x86 (a negative float cast to uint8 gives 256 - n, not 0).
template <typename To, typename From> struct Cvt {
  static __device__ __forceinline__ To run(From x) {
    if constexpr (is_int<To>::value && is_float<From>::value) {
      return (To)(long long)x;
    } else {
      return (To)x;
    }
  }
};
template <typename From> struct Cvt<bool, From> {
  static __device__ __forceinline__ bool run(From x) { return x != From(0); }
};
template <typename To> struct Cvt<To, __half> {
  static __device__ __forceinline__ To run(__half x) {
    return Cvt<To, float>::run(__half2float(x));
  }
};
template <typename To> struct Cvt<To, __nv_bfloat16> {
  static __device__ __forceinline__ To run(__nv_bfloat16 x) {
    return Cvt<To, float>::run(__bfloat162float(x));
  }
};
template <typename From> struct Cvt<__half, From> {
  static __device__ __forceinline__ __half run(From x) { return __float2half_rn((float)x); }
};
template <typename From> struct Cvt<__nv_bfloat16, From> {
  static __device__ __forceinline__ __nv_bfloat16 run(From x) {
    return __float2bfloat16_rn((float)x);
  }
};
template <> struct Cvt<__half, __half> {
  static __device__ __forceinline__ __half run(__half x) { return x; }
};
template <> struct Cvt<__nv_bfloat16, __nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 run(__nv_bfloat16 x) { return x; }
};
template <> struct Cvt<__half, __nv_bfloat16> {
  static __device__ __forceinline__ __half run(__nv_bfloat16 x) {
    return __float2half_rn(__bfloat162float(x));
  }
};
template <> struct Cvt<__nv_bfloat16, __half> {
  static __device__ __forceinline__ __nv_bfloat16 run(__half x) {
    return __float2bfloat16_rn(__half2float(x));
  }
};
template <> struct Cvt<bool, __half> {
  static __device__ __forceinline__ bool run(__half x) { return __half2float(x) != 0.0f; }
};
template <> struct Cvt<bool, __nv_bfloat16> {
  static __device__ __forceinline__ bool run(__nv_bfloat16 x) {
    return __bfloat162float(x) != 0.0f;
  }
};

template <typename To, typename From> __device__ __forceinline__ To cvt(From x) {
  return Cvt<To, From>::run(x);
}

// N elements of T loaded or stored as one access (the caller guarantees the alignment).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// ---- NaN-aware comparisons ---------------------------------------------------------------

template <typename T> __device__ __forceinline__ bool isnan_(T x) {
  if constexpr (is_float<T>::value) {
    return x != x;
  } else {
    return false;
  }
}
// numpy's maximum/minimum: a NaN in either operand wins.
template <typename T> __device__ __forceinline__ T max_(T a, T b) {
  return (isnan_(a) || a > b) ? a : b;
}
template <typename T> __device__ __forceinline__ T min_(T a, T b) {
  return (isnan_(a) || a < b) ? a : b;
}

// ---- unary kinds ---------------------------------------------------------------------------

#define KN_FLOAT_UNARY(NAME, F32, F64)                                          \
  __device__ __forceinline__ float u_##NAME(float x) { return F32; }           \
  __device__ __forceinline__ double u_##NAME(double x) { return F64; }

template <typename T> __device__ __forceinline__ T u_neg(T x) { return -x; }
template <typename T> __device__ __forceinline__ T u_abs(T x) {
  if constexpr (is_float<T>::value || is_signed<T>::value) {
    return x < T(0) ? T(-x) : x;
  } else {
    return x;
  }
}
template <typename T> __device__ __forceinline__ T u_sign(T x) {
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
}
template <typename T> __device__ __forceinline__ T u_relu(T x) { return x < T(0) ? T(0) : x; }
template <typename T> __device__ __forceinline__ T u_reciprocal(T x) {
  if constexpr (is_float<T>::value) {
    return T(1) / x;
  } else {
    return x == T(1) ? T(1) : (x == T(-1) ? T(-1) : T(0));
  }
}
KN_FLOAT_UNARY(exp, expf(x), exp(x))
KN_FLOAT_UNARY(log, logf(x), log(x))
KN_FLOAT_UNARY(sqrt, sqrtf(x), sqrt(x))
KN_FLOAT_UNARY(rsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))
KN_FLOAT_UNARY(sin, sinf(x), sin(x))
KN_FLOAT_UNARY(cos, cosf(x), cos(x))
KN_FLOAT_UNARY(tan, tanf(x), tan(x))
KN_FLOAT_UNARY(asin, asinf(x), asin(x))
KN_FLOAT_UNARY(acos, acosf(x), acos(x))
KN_FLOAT_UNARY(atan, atanf(x), atan(x))
KN_FLOAT_UNARY(sinh, sinhf(x), sinh(x))
KN_FLOAT_UNARY(cosh, coshf(x), cosh(x))
KN_FLOAT_UNARY(asinh, asinhf(x), asinh(x))
KN_FLOAT_UNARY(acosh, acoshf(x), acosh(x))
KN_FLOAT_UNARY(atanh, atanhf(x), atanh(x))
KN_FLOAT_UNARY(tanh, tanhf(x), tanh(x))
KN_FLOAT_UNARY(erf, erff(x), erf(x))
KN_FLOAT_UNARY(floor, floorf(x), floor(x))
KN_FLOAT_UNARY(ceil, ceilf(x), ceil(x))
KN_FLOAT_UNARY(round, rintf(x), rint(x))  // the default rounding mode is half to even
KN_FLOAT_UNARY(sigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
// logaddexp(x, 0), stable for large |x|.
KN_FLOAT_UNARY(softplus, fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))),
               fmax(x, 0.0) + log1p(exp(-fabs(x))))
KN_FLOAT_UNARY(gelu, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)),
               0.5 * x * (1.0 + erf(x * 0.70710678118654752)))
KN_FLOAT_UNARY(gelu_tanh,
               0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))),
               0.5 * x * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x))))
KN_FLOAT_UNARY(silu, x / (1.0f + expf(-x)), x / (1.0 + exp(-x)))
KN_FLOAT_UNARY(hard_sigmoid, fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f),
               fmin(fmax(x / 6.0 + 0.5, 0.0), 1.0))
KN_FLOAT_UNARY(hard_swish, x * fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f),
               x * fmin(fmax(x / 6.0 + 0.5, 0.0), 1.0))
__device__ __forceinline__ bool u_not(bool x) { return !x; }
template <typename T> __device__ __forceinline__ T u_bitwise_not(T x) { return T(~x); }
template <typename T> __device__ __forceinline__ bool u_is_nan(T x) { return isnan_(x); }
template <typename T> __device__ __forceinline__ bool u_is_inf(T x) {
  if constexpr (is_float<T>::value) {
    return x == T(KN_INF_D) || x == T(-KN_INF_D);
  } else {
    return false;
  }
}

// ---- binary kinds --------------------------------------------------------------------------

// Float sums and products round once each, as numpy's do: NVRTC runs with --fmad=true, and a
// product feeding a sum would otherwise contract into one FMA. That keeps fused bodies equal to
// the CPU oracle bit for bit where it matters (a quantization rounds what they compute), at no
// cost worth measuring in kernels that wait on memory.
template <typename T> __device__ __forceinline__ T b_add(T a, T b) { return a + b; }
template <typename T> __device__ __forceinline__ T b_sub(T a, T b) { return a - b; }
template <typename T> __device__ __forceinline__ T b_mul(T a, T b) { return a * b; }
template <> __device__ __forceinline__ float b_add<float>(float a, float b) {
  return __fadd_rn(a, b);
}
template <> __device__ __forceinline__ float b_sub<float>(float a, float b) {
  return __fsub_rn(a, b);
}
template <> __device__ __forceinline__ float b_mul<float>(float a, float b) {
  return __fmul_rn(a, b);
}
template <> __device__ __forceinline__ double b_add<double>(double a, double b) {
  return __dadd_rn(a, b);
}
template <> __device__ __forceinline__ double b_sub<double>(double a, double b) {
  return __dsub_rn(a, b);
}
template <> __device__ __forceinline__ double b_mul<double>(double a, double b) {
  return __dmul_rn(a, b);
}
template <typename T> __device__ __forceinline__ T b_div(T a, T b) {
  if constexpr (is_int<T>::value) {
    if (b == T(0)) return T(0);  // numpy gives 0 (with a warning)
    if constexpr (is_signed<T>::value) {
      if (b == T(-1)) return T(-a);  // avoids the trap of INT_MIN / -1
    }
    return a / b;  // C truncates toward zero, as ONNX Div does
  } else {
    return a / b;
  }
}
template <typename T> __device__ __forceinline__ T b_pow(T a, T b) {
  if constexpr (is_int<T>::value) {
    if (b < T(0)) return a == T(1) ? T(1) : T(0);
    T result = T(1);
    T base = a;
    T e = b;
    while (e > T(0)) {
      if (e & T(1)) result = T(result * base);
      base = T(base * base);
      e = T(e >> 1);
    }
    return result;
  } else if constexpr (sizeof(T) == 4) {
    return powf(a, b);
  } else {
    return pow(a, b);
  }
}
template <typename T> __device__ __forceinline__ T b_min(T a, T b) { return min_(a, b); }
template <typename T> __device__ __forceinline__ T b_max(T a, T b) { return max_(a, b); }
template <typename T> __device__ __forceinline__ T b_fmod(T a, T b) {
  if constexpr (is_int<T>::value) {
    return b == T(0) ? T(0) : T(a % b);
  } else if constexpr (sizeof(T) == 4) {
    return fmodf(a, b);
  } else {
    return fmod(a, b);
  }
}
// Python's %: the result takes the divisor's sign.
template <typename T> __device__ __forceinline__ T b_mod(T a, T b) {
  if constexpr (is_int<T>::value) {
    if (b == T(0)) return T(0);
    T r = T(a % b);
    if constexpr (is_signed<T>::value) {
      if (r != T(0) && ((r < T(0)) != (b < T(0)))) r = T(r + b);
    }
    return r;
  } else {
    T r = b_fmod(a, b);
    if (r != T(0) && ((r < T(0)) != (b < T(0)))) r += b;
    return r;
  }
}
template <typename T> __device__ __forceinline__ bool b_equal(T a, T b) { return a == b; }
template <typename T> __device__ __forceinline__ bool b_less(T a, T b) { return a < b; }
template <typename T> __device__ __forceinline__ bool b_less_equal(T a, T b) { return a <= b; }
template <typename T> __device__ __forceinline__ bool b_greater(T a, T b) { return a > b; }
template <typename T> __device__ __forceinline__ bool b_greater_equal(T a, T b) {
  return a >= b;
}
template <typename T> __device__ __forceinline__ bool b_and(T a, T b) { return a && b; }
template <typename T> __device__ __forceinline__ bool b_or(T a, T b) { return a || b; }
template <typename T> __device__ __forceinline__ bool b_xor(T a, T b) { return bool(a) != bool(b); }
template <typename T> __device__ __forceinline__ T b_bitwise_and(T a, T b) { return T(a & b); }
template <typename T> __device__ __forceinline__ T b_bitwise_or(T a, T b) { return T(a | b); }
template <typename T> __device__ __forceinline__ T b_bitwise_xor(T a, T b) { return T(a ^ b); }
template <typename T> __device__ __forceinline__ T b_shift_left(T a, T b) {
  return (b < T(0) || b >= T(8 * sizeof(T))) ? T(0) : T(a << b);
}
template <typename T> __device__ __forceinline__ T b_shift_right(T a, T b) {
  if (b < T(0) || b >= T(8 * sizeof(T))) return a < T(0) ? T(-1) : T(0);
  return T(a >> b);
}

template <typename T> __device__ __forceinline__ T clamp_(T x, T lo, T hi) {
  return min_(max_(x, lo), hi);
}

// ---- block reductions ------------------------------------------------------------------

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct ProdOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; }
};
struct MaxOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
    return max_(a, b);
  }
};
struct MinOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
    return min_(a, b);
  }
};

template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T x, Op op) {
#pragma unroll
  for (int step = 16; step > 0; step >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, step));
  return x;
}

// Every thread of the block gets the result. `scratch` holds 32 values; blockDim.x is a
// multiple of 32. Ends with a barrier, so scratch may be reused right away.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T x, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  x = warp_reduce(x, op);
  if (blockDim.x > 32) {
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x >> 5) ? scratch[lane] : identity;
    x = warp_reduce(x, op);
    __syncthreads();
  }
  return x;
}

// ---- atomics for scatter with a reduction ---------------------------------------------------

// A compare-and-swap loop on the aligned 32-bit word that holds the element, so that every
// element size (1, 2, 4 bytes) works; 8-byte elements swap whole.
template <typename T, typename F> __device__ __forceinline__ void atomic_update(T* where, F f) {
  if constexpr (sizeof(T) == 8) {
    unsigned long long* word = reinterpret_cast<unsigned long long*>(where);
    unsigned long long old = *word;
    unsigned long long assumed;
    do {
      assumed = old;
      T value;
      memcpy(&value, &assumed, 8);
      T updated = f(value);
      unsigned long long bits;
      memcpy(&bits, &updated, 8);
      old = atomicCAS(word, assumed, bits);
    } while (old != assumed);
  } else {
    const unsigned long long address = reinterpret_cast<unsigned long long>(where);
    unsigned int* word = reinterpret_cast<unsigned int*>(address & ~3ull);
    const unsigned int shift = (unsigned int)(address & 3ull) * 8u;
    const unsigned int mask = sizeof(T) == 4 ? 0xffffffffu : ((1u << (8 * sizeof(T))) - 1u);
    unsigned int old = *word;
    unsigned int assumed;
    do {
      assumed = old;
      unsigned int part = (assumed >> shift) & mask;
      T value;
      memcpy(&value, &part, sizeof(T));
      T updated = f(value);
      unsigned int bits = 0;
      memcpy(&bits, &updated, sizeof(T));
      old = atomicCAS(word, assumed, (assumed & ~(mask << shift)) | ((bits & mask) << shift));
    } while (old != assumed);
  }
}

}  // namespace kn
