// Shared CPU building blocks: aligned scratch, the task-parallel loop with
// runtime ISA dispatch, vectorized activations, panel packing and the
// register-blocked GEMM micro-kernel every kernel is built from.
//
// Every kernel here is a product C = A B^T (rows of both operands contiguous
// along the reduction) followed by a fused epilogue. B is packed into panels
// of kNR rows, interleaved along the reduction (panel[kk * kNR + jj]); A is
// read in place through kMR row pointers, so building A on the fly (face-
// splitting rows, hidden activations) costs nothing extra.
//
// The extension is built without -march flags so it runs on any x86-64 CPU;
// parallel_tasks compiles each task body twice (AVX2+FMA and baseline) and
// picks one at run time. Task bodies are lambdas taking an Isa tag that they
// pass on to micro_kernel/activate/dot, all forced inline so they are compiled
// for the caller's ISA.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "kernels.h"

#ifdef FACTKERNELS_OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FK_X86_DISPATCH 1
#endif

// Forces inlining, so a helper is compiled for the ISA of the task that calls it.
#define FK_INLINE inline __attribute__((always_inline))
#define FK_LAMBDA_INLINE __attribute__((always_inline))

// Vector values never cross a call boundary (every helper is forced inline),
// so the ABI note about 256-bit vectors in baseline code does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace factkernels {
namespace cpu {

// ---------------------------------------------------------------- ISA tags

// 128-bit vectors (SSE2 / NEON); 3 rows per pass keep 12 accumulators in the 16 registers.
struct IsaBase {
  static constexpr int kVecBytes = 16;
  static constexpr int kRowGroup = 3;
};
#ifdef FK_X86_DISPATCH
// 256-bit vectors with FMA: 6 x 2 accumulators + 2 B vectors + 1 broadcast = 15 registers.
struct IsaAvx2 {
  static constexpr int kVecBytes = 32;
  static constexpr int kRowGroup = 6;
};

inline bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

// --------------------------------------------------------------- scratch

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T> using Buffer = std::unique_ptr<T[], FreeDeleter>;

// 64-byte aligned, uninitialized (zeroed when asked) storage for count elements.
template <typename T> Buffer<T> alloc_buffer(int64_t count, bool zero = false) {
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  if (zero) std::memset(p, 0, bytes);
  return Buffer<T>(static_cast<T*>(p));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --------------------------------------------------------------- threads

inline int thread_id() {
#ifdef FACTKERNELS_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

template <class F> void run_task_base(const F& task, int64_t t) { task(t, thread_id(), IsaBase{}); }
#ifdef FK_X86_DISPATCH
template <class F> __attribute__((target("avx2,fma"))) void run_task_avx2(const F& task, int64_t t) {
  task(t, thread_id(), IsaAvx2{});
}
#endif

// Below this many element operations (~0.1 ms on one core) a loop runs on the
// calling thread: a parallel region costs a wake-up and a barrier, and up to a
// scheduler time slice when other processes hold the cores.
constexpr int64_t kMinParallelWork = int64_t(1) << 22;

// Runs task(t, thread, isa) for t in [0, ntasks), dynamically scheduled since
// tasks differ in cost (triangular tiles, ragged edges). thread < num_threads()
// indexes per-thread scratch; work is the rough total cost in element operations.
template <class F>
void parallel_tasks(int64_t ntasks, const F& task, int64_t work = std::numeric_limits<int64_t>::max()) {
  if (ntasks <= 0) return;
#ifdef FK_X86_DISPATCH
  const bool avx2 = has_avx2_fma();
#endif
#ifdef FACTKERNELS_OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (ntasks > 1 && work >= kMinParallelWork)
#else
  (void)work;
#endif
  for (int64_t t = 0; t < ntasks; ++t) {
#ifdef FK_X86_DISPATCH
    if (avx2) {
      run_task_avx2(task, t);
      continue;
    }
#endif
    run_task_base(task, t);
  }
}

// --------------------------------------------------------------- vectors

template <typename T, class Isa> struct Vec {
  static constexpr int kLanes = Isa::kVecBytes / static_cast<int>(sizeof(T));
  typedef T type __attribute__((vector_size(Isa::kVecBytes)));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> itype
      __attribute__((vector_size(Isa::kVecBytes)));
  static FK_INLINE type load(const T* p) {
    type v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static FK_INLINE void store(T* p, const type& v) { std::memcpy(p, &v, sizeof v); }
  static FK_INLINE type splat(T x) { return type{} + x; }
};

// Asks for the cache lines of bytes [p, p + bytes) ahead of their use. A plain function, not a lambda: GCC 12
// deleted a lambda's loop of __builtin_prefetch as code without effect (corral_solve's "two ahead" fetch was gone).
FK_INLINE void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o);
}

// sum_k x[k] * y[k], vectorized (the compiler may not reorder a scalar FP sum).
template <class Isa, typename T> FK_INLINE T dot(Isa, const T* x, const T* y, int64_t n) {
  using VT = Vec<T, Isa>;
  constexpr int L = VT::kLanes;
  typename VT::type acc0{}, acc1{};
  int64_t k = 0;
  for (; k + 2 * L <= n; k += 2 * L) {
    acc0 += VT::load(x + k) * VT::load(y + k);
    acc1 += VT::load(x + k + L) * VT::load(y + k + L);
  }
  acc0 += acc1;
  T s = 0;
  for (int l = 0; l < L; ++l) s += acc0[l];
  for (; k < n; ++k) s += x[k] * y[k];
  return s;
}

// ----------------------------------------------------------- activations

// Range-reduction constants: x = n ln2 + r with |r| <= ln2/2, ln2 split so n * kLn2Hi is exact.
template <typename T> struct MathConst;
template <> struct MathConst<float> {
  static constexpr int kMantBits = 23, kExpBias = 127;
  static constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kMinArg = -87.0f, kMaxArg = 88.0f;  // 2^n stays a normal number
  static constexpr int kExpTerms = 7;                        // Taylor degree of expm1 on |r| <= ln2/2
  static constexpr int kLog1pTerms = 8;                      // atanh series terms for u <= 1/3
};
template <> struct MathConst<double> {
  static constexpr int kMantBits = 52, kExpBias = 1023;
  static constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kMinArg = -708.0, kMaxArg = 709.0;
  static constexpr int kExpTerms = 13;
  static constexpr int kLog1pTerms = 18;
};

template <typename T> constexpr T inv_factorial(int k) {
  T f = 1;
  for (int i = 2; i <= k; ++i) f *= static_cast<T>(i);
  return T(1) / f;
}

// Branch-free vector math, accurate to a few ulp, so activations vectorize
// (scalar libm calls would cost more than the GEMM that feeds them).
template <typename T, class Isa> struct VecMath {
  using VT = Vec<T, Isa>;
  using V = typename VT::type;
  using VI = typename VT::itype;
  using C = MathConst<T>;

  template <typename To, typename From> static FK_INLINE To bitcast(const From& x) {
    To y;
    std::memcpy(&y, &x, sizeof y);
    return y;
  }
  static FK_INLINE V select(const VI& mask, const V& a, const V& b) { return mask ? a : b; }
  static FK_INLINE V abs(const V& x) { return select(x < V{}, -x, x); }

  // Returns 2^n and sets em1r = expm1(r), where x = n ln2 + r (x clamped to the normal range).
  static FK_INLINE V reduce(const V& arg, V& em1r) {
    const V lo = VT::splat(C::kMinArg), hi = VT::splat(C::kMaxArg);
    V x = select(arg < lo, lo, arg);
    x = select(x > hi, hi, x);
    const V t = x * T(1.4426950408889634) + C::kRound;
    const V nf = t - C::kRound;
    const V r = (x - nf * C::kLn2Hi) - nf * C::kLn2Lo;
    V p = VT::splat(inv_factorial<T>(C::kExpTerms));
#pragma GCC unroll 16
    for (int k = C::kExpTerms - 1; k >= 2; --k) p = p * r + inv_factorial<T>(k);
    em1r = r + r * r * p;
    // t = kRound + n exactly, so the difference of the bit patterns is n.
    const VI n = bitcast<VI>(t) - bitcast<VI>(VT::splat(C::kRound));
    return bitcast<V>((n + C::kExpBias) << C::kMantBits);
  }
  static FK_INLINE V exp(const V& x) {
    V em1r;
    const V scale = reduce(x, em1r);
    return select(x < VT::splat(C::kMinArg), V{}, scale + scale * em1r);
  }
  static FK_INLINE V expm1(const V& x) {
    V em1r;
    const V scale = reduce(x, em1r);
    return scale * em1r + (scale - T(1));  // exact em1r when n == 0, so small x keep full precision
  }
  // log1p(z) for z in [0, 1]: 2 atanh(u), u = z / (2 + z) <= 1/3.
  static FK_INLINE V log1p_unit(const V& z) {
    const V u = z / (z + T(2));
    const V u2 = u * u;
    V s = VT::splat(T(1) / (2 * C::kLog1pTerms - 1));
#pragma GCC unroll 32
    for (int k = C::kLog1pTerms - 2; k >= 0; --k) s = s * u2 + T(1) / (2 * k + 1);
    return T(2) * u * s;
  }
  // Stable: only exp(-|x|) <= 1 is ever formed.
  static FK_INLINE V sigmoid(const V& x) {
    const V z = exp(-abs(x));
    const V s = T(1) / (z + T(1));
    return select(x >= V{}, s, z * s);
  }
  static FK_INLINE V tanh(const V& x) {
    const V e = expm1(T(-2) * abs(x));
    const V t = -e / (e + T(2));
    return select(x < V{}, -t, t);
  }
  // log1p(e^x) = max(x, 0) + log1p(e^-|x|); x itself above 20 (torch's threshold).
  static FK_INLINE V softplus(const V& x) {
    const V y = select(x > V{}, x, V{}) + log1p_unit(exp(-abs(x)));
    return select(x > VT::splat(T(20)), x, y);
  }
  // x Phi(x) = x erfc(-x / sqrt2) / 2, float only. erfc(z) = t exp(-z^2 + P(t)),
  // t = 1 / (1 + z/2), is the Chebyshev fit of Numerical Recipes (relative error
  // < 1.1e-7 for all z >= 0). exp(-x^2/2) is split at hi = x cut to 12 significant bits,
  // whose square is exact, so the negative tail keeps full relative precision.
  static FK_INLINE V gelu(const V& x) {
    static_assert(sizeof(T) == 4, "the erfc fit is float-accurate only");
    constexpr T c[] = {-1.26551223f, 1.00002368f, 0.37409196f, 0.09678418f, -0.18628806f,
                       0.27886807f,  -1.13520398f, 1.48851587f, -0.82215223f, 0.17087277f};
    const V t = T(1) / (abs(x) * T(0.35355339059327376220) + T(1));
    V p = VT::splat(c[9]);
#pragma GCC unroll 9
    for (int k = 8; k >= 0; --k) p = p * t + c[k];
    const V hi = bitcast<V>(bitcast<VI>(x) & ~0xfff);
    const V e = t * exp(hi * hi * T(-0.5)) * exp((hi - x) * (hi + x) * T(0.5) + p);  // erfc(|x| / sqrt2)
    return T(0.5) * x * select(x > V{}, T(2) - e, e);
  }
};

// x Phi(x) written with erfc, which keeps full precision in the negative tail.
template <typename T> FK_INLINE T gelu_scalar(T x) {
  return T(0.5) * x * std::erfc(x * T(-0.70710678118654752440));
}

// x[k] = act(x[k]) for k < count; count is a multiple of the vector width.
template <class Isa, typename T> FK_INLINE void activate(Isa, Activation act, T* x, int64_t count) {
  using M = VecMath<T, Isa>;
  using VT = Vec<T, Isa>;
  constexpr int L = VT::kLanes;
  switch (act) {
    case Activation::kSilu:
      for (int64_t k = 0; k < count; k += L) {
        const auto v = VT::load(x + k);
        VT::store(x + k, v * M::sigmoid(v));
      }
      break;
    case Activation::kGelu:
      if constexpr (sizeof(T) == 4) {
        for (int64_t k = 0; k < count; k += L) VT::store(x + k, M::gelu(VT::load(x + k)));
      } else {  // no double-accurate vector erfc here: libm
        for (int64_t k = 0; k < count; ++k) x[k] = gelu_scalar(x[k]);
      }
      break;
    case Activation::kTanh:
      for (int64_t k = 0; k < count; k += L) VT::store(x + k, M::tanh(VT::load(x + k)));
      break;
    case Activation::kSigmoid:
      for (int64_t k = 0; k < count; k += L) VT::store(x + k, M::sigmoid(VT::load(x + k)));
      break;
    case Activation::kSoftplus:
      for (int64_t k = 0; k < count; k += L) VT::store(x + k, M::softplus(VT::load(x + k)));
      break;
  }
}

// ------------------------------------------------------ GEMM micro-kernel

constexpr int kMR = 6;                                       // rows of A per micro-tile
template <typename T> constexpr int kNR = 64 / sizeof(T);    // rows of B per panel (16 float, 8 double)
constexpr int64_t kRowBlock = 16 * kMR;                      // rows of A per task

// Packs rows [0, rows) x [0, k) of B, element (r, kk) at src[r * rs + kk * cs],
// into one panel: dst[kk * kNR + jj], zero beyond `rows` so edge tiles need no masking.
// The loop order follows the unit stride of src, so reads stream.
template <typename T>
FK_INLINE void pack_panel(const T* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, T* dst) {
  constexpr int NR = kNR<T>;
  if (rows < NR)
    for (int64_t kk = 0; kk < k; ++kk) std::fill(dst + kk * NR + rows, dst + kk * NR + NR, T(0));
  if (cs == 1) {
    for (int64_t jj = 0; jj < rows; ++jj)
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * NR + jj] = src[jj * rs + kk];
  } else {
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t jj = 0; jj < rows; ++jj) dst[kk * NR + jj] = src[jj * rs + kk * cs];
  }
}

template <typename T> struct Panels {
  Buffer<T> data;
  int64_t count = 0, k = 0;
  const T* panel(int64_t p) const { return data.get() + p * kNR<T> * k; }
};

// All `rows` rows of B packed as ceil(rows / kNR) panels of reduction length k.
template <typename T> Panels<T> pack_panels(const T* src, int64_t rs, int64_t cs, int64_t rows, int64_t k) {
  constexpr int NR = kNR<T>;
  Panels<T> out;
  out.count = ceil_div(rows, NR);
  out.k = k;
  out.data = alloc_buffer<T>(out.count * NR * k);
  T* dst = out.data.get();
  parallel_tasks(out.count, [&](int64_t p, int, auto) FK_LAMBDA_INLINE {
    pack_panel(src + p * NR * rs, rs, cs, std::min<int64_t>(NR, rows - p * NR), k, dst + p * NR * k);
  }, rows * k);
  return out;
}

// b[0, n) (zeros if b is null) padded with zeros to n_pad, for whole-panel epilogues.
template <typename T> Buffer<T> padded_vector(const T* b, int64_t n, int64_t n_pad) {
  Buffer<T> out = alloc_buffer<T>(n_pad, /*zero=*/true);
  if (b) std::copy(b, b + n, out.get());
  return out;
}

// Row pointers for the kMR rows starting at base; rows past `rows` repeat the
// last valid one so the micro-kernel never reads out of bounds.
template <typename T> FK_INLINE void row_ptrs(const T* base, int64_t ld, int64_t rows, const T* (&a)[kMR]) {
  for (int ii = 0; ii < kMR; ++ii) a[ii] = base + std::min<int64_t>(ii, rows - 1) * ld;
}

// c[ii * ldc + jj] (+)= sum_{kk < k} a[ii][kk] * b[kk * kNR + jj] for ii < kMR and
// jj < NVC vectors' worth of columns. a: kMR row pointers, unit stride along k;
// b: one packed panel; accumulate adds to c (reductions split into chunks).
template <int NVC, class Isa, typename T>
FK_INLINE void micro_kernel_nv(int64_t k, const T* const* a, const T* __restrict b, T* __restrict c, int64_t ldc,
                               bool accumulate) {
  using VT = Vec<T, Isa>;
  using V = typename VT::type;
  constexpr int L = VT::kLanes, NR = kNR<T>, G = Isa::kRowGroup;
#pragma GCC unroll 2
  for (int g = 0; g < kMR; g += G) {
    V acc[G][NVC] = {};
    if (accumulate) {
#pragma GCC unroll 6
      for (int ii = 0; ii < G; ++ii)
#pragma GCC unroll 4
        for (int v = 0; v < NVC; ++v) acc[ii][v] = VT::load(c + (g + ii) * ldc + v * L);
    }
    const T* ap[G];
#pragma GCC unroll 6
    for (int ii = 0; ii < G; ++ii) ap[ii] = a[g + ii];
    for (int64_t kk = 0; kk < k; ++kk) {
      V bv[NVC];
#pragma GCC unroll 4
      for (int v = 0; v < NVC; ++v) bv[v] = VT::load(b + kk * NR + v * L);
#pragma GCC unroll 6
      for (int ii = 0; ii < G; ++ii) {
        const T av = ap[ii][kk];
#pragma GCC unroll 4
        for (int v = 0; v < NVC; ++v) acc[ii][v] += av * bv[v];
      }
    }
#pragma GCC unroll 6
    for (int ii = 0; ii < G; ++ii)
#pragma GCC unroll 4
      for (int v = 0; v < NVC; ++v) VT::store(c + (g + ii) * ldc + v * L, acc[ii][v]);
  }
}

// The kMR x kNR micro-tile of a-rows times panel b. Only the first `cols`
// columns are needed: a panel at most half full computes half the columns,
// leaving the rest of the tile unwritten (ragged last panels waste less).
template <class Isa, typename T>
FK_INLINE void micro_kernel(Isa, int64_t k, const T* const* a, const T* b, T* c, int64_t ldc, int64_t cols,
                            bool accumulate = false) {
  constexpr int NV = kNR<T> / Vec<T, Isa>::kLanes;
  if (2 * cols <= kNR<T>) {
    micro_kernel_nv<NV / 2, Isa>(k, a, b, c, ldc, accumulate);
  } else {
    micro_kernel_nv<NV, Isa>(k, a, b, c, ldc, accumulate);
  }
}

// Copies the top-left rows x cols corner of a tile (leading dimension ldc) to dst.
template <typename T>
FK_INLINE void store_tile(const T* c, int64_t ldc, int64_t rows, int64_t cols, T* dst, int64_t ld) {
  for (int64_t ii = 0; ii < rows; ++ii) std::memcpy(dst + ii * ld, c + ii * ldc, cols * sizeof(T));
}

// c[ii * ldc + jj] += v[jj] for ii < kMR, jj < kNR (bias rows).
template <class Isa, typename T> FK_INLINE void add_row_vector(Isa, T* c, int64_t ldc, const T* v) {
  using VT = Vec<T, Isa>;
  constexpr int L = VT::kLanes;
  for (int ii = 0; ii < kMR; ++ii)
    for (int jj = 0; jj < kNR<T>; jj += L) VT::store(c + ii * ldc + jj, VT::load(c + ii * ldc + jj) + VT::load(v + jj));
}

}  // namespace cpu
}  // namespace factkernels
