// out = act(x w^T + b): one packed-panel GEMM with bias and activation fused
// into the store of each micro-tile.
#include "cpu/common.h"

namespace factkernels {
namespace cpu {

int num_threads() {
#ifdef FACTKERNELS_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

template <typename T> void gate_features(const GateFeaturesArgs<T>& a) {
  if (a.n <= 0 || a.h <= 0) return;
  constexpr int NR = kNR<T>;
  // w is small (h x k): packed once, it stays in L2 while every row block streams past it.
  const Panels<T> w = pack_panels(a.w, a.ldw, 1, a.h, a.k);
  const Buffer<T> bias = padded_vector(a.b, a.h, w.count * NR);

  parallel_tasks(ceil_div(a.n, kRowBlock), [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
    alignas(64) T c[kMR * NR];
    const int64_t i_end = std::min(a.n, (t + 1) * kRowBlock);
    for (int64_t i0 = t * kRowBlock; i0 < i_end; i0 += kMR) {
      const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
      const T* x[kMR];
      row_ptrs(a.x + i0 * a.ldx, a.ldx, rows, x);
      for (int64_t p = 0; p < w.count; ++p) {
        const int64_t cols = std::min<int64_t>(NR, a.h - p * NR);
        micro_kernel(isa, a.k, x, w.panel(p), c, NR, cols);
        add_row_vector(isa, c, NR, bias.get() + p * NR);
        activate(isa, a.act, c, kMR * NR);
        store_tile(c, NR, rows, cols, a.out + i0 * a.ldo + p * NR, a.ldo);
      }
    }
  }, a.n * a.h * a.k);
}

template void gate_features<float>(const GateFeaturesArgs<float>&);
template void gate_features<double>(const GateFeaturesArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
