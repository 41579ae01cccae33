// out = act(x w^T + b) as one tiled product with a bias + activation epilogue.
#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

template <typename T> struct GateEpilogue {
  const T* b;
  T* out;
  int64_t ldo;
  Activation act;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, T v) const {
    out[r * ldo + c] = activate(act, b ? v + b[c] : v);
  }
};

}  // namespace

template <typename T> void gate_features(const GateFeaturesArgs<T>& a, uintptr_t stream) {
  launch_product<T, true, true>(RowMajor<T>{a.x, a.ldx}, a.n, RowMajor<T>{a.w, a.ldw}, a.h, a.k,
                                GateEpilogue<T>{a.b, a.out, a.ldo, a.act}, as_stream(stream), "gate_features");
}

template void gate_features<float>(const GateFeaturesArgs<float>&, uintptr_t);
template void gate_features<double>(const GateFeaturesArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
