// Fused gated MLP in three tiled products per chunk of rows: gate =
// act(x Wg^T + bg) (hg wide), hidden = gate[:, r mod hg] * (x Wu^T + bu), and
// out = hidden Wd^T + bd. Gate and hidden live in the caller's scratch, sized
// for one chunk of rows, so memory stays bounded for any n.
#include <algorithm>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

template <typename T> struct GatedUpEpilogue {
  const T* bu;
  const T* gate;
  int64_t hg;
  T* hid;
  int64_t h;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, T v) const {
    hid[r * h + c] = (bu ? v + bu[c] : v) * gate[r * hg + static_cast<uint32_t>(c) % static_cast<uint32_t>(hg)];
  }
};

template <typename T> struct BiasEpilogue {
  const T* b;
  T* out;
  int64_t ldo;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, T v) const {
    out[r * ldo + c] = b ? v + b[c] : v;
  }
};

}  // namespace

template <typename T> void gated_forward(const GatedForwardArgs<T>& a, uintptr_t stream) {
  if (a.n <= 0 || a.d_out <= 0) return;
  if (a.chunk_rows <= 0 || a.scratch == nullptr)
    throw std::invalid_argument("gated_forward: CUDA needs scratch for chunk_rows * (hg + h) elements");
  const cudaStream_t st = as_stream(stream);
  const int64_t chunk = std::min(a.n, a.chunk_rows);
  T* gate = a.scratch;
  T* hid = a.scratch + chunk * a.hg;
  for (int64_t i0 = 0; i0 < a.n; i0 += chunk) {
    const int64_t rows = std::min(chunk, a.n - i0);
    const T* x = a.x + i0 * a.ldx;
    gate_features<T>(GateFeaturesArgs<T>{x, a.ldx, a.wg, a.d_in, a.bg, gate, a.hg, rows, a.d_in, a.hg, a.act},
                     stream);
    launch_product<T, true, true>(RowMajor<T>{x, a.ldx}, rows, RowMajor<T>{a.wu, a.d_in}, a.h, a.d_in,
                                  GatedUpEpilogue<T>{a.bu, gate, a.hg, hid, a.h}, st,
                                  "gated_forward (up)");
    launch_product<T, true, true>(RowMajor<T>{hid, a.h}, rows, RowMajor<T>{a.wd, a.h}, a.d_out, a.h,
                                  BiasEpilogue<T>{a.bd, a.out + i0 * a.ldo, a.ldo}, st, "gated_forward (down)");
  }
}

template void gated_forward<float>(const GatedForwardArgs<float>&, uintptr_t);
template void gated_forward<double>(const GatedForwardArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
