// Matrix-free gadget products as tiled products whose operands are formed
// while loading shared memory; M (n x h q) is never written out.
#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

// Row i of M: M[i, r q + c] = s[i, r] p[i, c].
template <typename T> struct FaceSplitRows {
  const T* s;
  int64_t lds;
  const T* p;
  int64_t ldp;
  int64_t q;
  __device__ __forceinline__ T operator()(int64_t i, int64_t k) const {
    const uint32_t r = static_cast<uint32_t>(k) / static_cast<uint32_t>(q);  // h q < 2^32: cheap 32-bit divide
    return s[i * lds + r] * p[i * ldp + (k - static_cast<int64_t>(r) * q)];
  }
};

// W^T[j h + r, i] = y[i, j] s[i, r], reduction index i.
template <typename T> struct WeightedRows {
  const T* y;
  int64_t ldy;
  const T* s;
  int64_t lds;
  int64_t h;
  __device__ __forceinline__ T operator()(int64_t g, int64_t i) const {
    const uint32_t j = static_cast<uint32_t>(g) / static_cast<uint32_t>(h);  // m h < 2^32
    return y[i * ldy + j] * s[i * lds + (g - static_cast<int64_t>(j) * h)];
  }
};

template <typename T> struct StoreEpilogue {
  T* out;
  int64_t ldo;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, T v) const { out[r * ldo + c] = v; }
};

// Split-reduction partial sums: several blocks add into one zeroed output entry.
template <typename T> struct AddEpilogue {
  T* out;
  int64_t ldo;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, T v) const { atomicAdd(out + r * ldo + c, v); }
};

}  // namespace

// out (n x m) = M coef^T, coef viewed as (m, h q).
template <typename T> void gadget_matvec(const GadgetProductArgs<T>& a, uintptr_t stream) {
  const int64_t hq = a.h * a.q;
  if (hq > 0xffffffffLL) throw std::invalid_argument("gadget_matvec: h * q must be below 2^32");
  launch_product<T, true, true>(FaceSplitRows<T>{a.s, a.lds, a.p, a.ldp, a.q}, a.n, RowMajor<T>{a.in, hq}, a.m,
                                hq, StoreEpilogue<T>{a.out, a.ldy}, as_stream(stream), "gadget_matvec");
}

// out (m h x q) = W^T p, reducing over the n rows. The output is small (m h x q) and the
// reduction long (n up to millions), so n is split across blocks until the GPU is full
// (two blocks per multiprocessor), each split at least kMinSplitRows long; the partial
// sums are added atomically, so float results may differ in the last bits run to run.
template <typename T> void gadget_rmatvec(const GadgetProductArgs<T>& a, uintptr_t stream) {
  if (a.m * a.h > 0xffffffffLL) throw std::invalid_argument("gadget_rmatvec: m * h must be below 2^32");
  if (a.m * a.h <= 0 || a.q <= 0) return;
  constexpr int64_t kMinSplitRows = 256;
  const cudaStream_t st = as_stream(stream);
  const int64_t tiles = ceil_div(a.m * a.h, Tile64::BM) * ceil_div(a.q, Tile64::BN);
  const int64_t splits = std::min(ceil_div(2 * multiprocessor_count(), tiles), std::max<int64_t>(1, a.n / kMinSplitRows));
  const WeightedRows<T> w{a.in, a.ldy, a.s, a.lds, a.h};
  const ColMajor<T> p{a.p, a.ldp};
  if (splits <= 1) {
    launch_product<T, false, false>(w, a.m * a.h, p, a.q, a.n, StoreEpilogue<T>{a.out, a.q}, st, "gadget_rmatvec");
    return;
  }
  check(cudaMemsetAsync(a.out, 0, sizeof(T) * static_cast<size_t>(a.m * a.h * a.q), st), "cudaMemsetAsync");
  launch_product<T, false, false>(w, a.m * a.h, p, a.q, a.n, AddEpilogue<T>{a.out, a.q}, st, "gadget_rmatvec",
                                  splits);
}

template void gadget_matvec<float>(const GadgetProductArgs<float>&, uintptr_t);
template void gadget_matvec<double>(const GadgetProductArgs<double>&, uintptr_t);
template void gadget_rmatvec<float>(const GadgetProductArgs<float>&, uintptr_t);
template void gadget_rmatvec<double>(const GadgetProductArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
