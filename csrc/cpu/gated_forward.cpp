// Fused gated MLP: out = Wd (act(Wg x + bg)[r mod hg] * (Wu x + bu)) + bd.
// Each task owns kRowBlock rows. Hidden units are processed in chunks of kHC,
// so only a (rows x kHC) slice of the hidden matrix ever exists, and the
// chunk's packed Wu and Wd panels stay in L2 while the rows stream past.
#include "cpu/common.h"

namespace factkernels {
namespace cpu {

template <typename T> void gated_forward(const GatedForwardArgs<T>& a) {
  const int64_t n = a.n, d_in = a.d_in, h = a.h, hg = a.hg, d_out = a.d_out;
  if (n <= 0 || d_out <= 0) return;
  constexpr int NR = kNR<T>;
  constexpr int64_t kHC = 16 * NR;
  const Panels<T> wg = pack_panels(a.wg, d_in, 1, hg, d_in);
  const Panels<T> wu = pack_panels(a.wu, d_in, 1, h, d_in);
  const Panels<T> wd = pack_panels(a.wd, h, 1, d_out, h);
  const Buffer<T> bg = padded_vector(a.bg, hg, wg.count * NR);
  const Buffer<T> bu = padded_vector(a.bu, h, wu.count * NR);

  // Gate rows are extended periodically past hg (gate[t] = gate[t mod hg]), so
  // the gate values of any kNR consecutive hidden units are contiguous.
  const int64_t ldg = wg.count * NR + NR;
  const int64_t ldo = wd.count * NR;
  const int64_t per_thread = kRowBlock * (ldg + kHC + ldo);
  const Buffer<T> scratch = alloc_buffer<T>(num_threads() * per_thread);

  parallel_tasks(ceil_div(n, kRowBlock), [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    using VT = Vec<T, decltype(isa)>;
    T* gate = scratch.get() + tid * per_thread;
    T* hid = gate + kRowBlock * ldg;
    T* acc = hid + kRowBlock * kHC;
    const int64_t i_begin = t * kRowBlock, i_end = std::min(n, i_begin + kRowBlock);

    for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
      const T* xr[kMR];
      row_ptrs(a.x + i0 * a.ldx, a.ldx, i_end - i0, xr);
      T* g = gate + (i0 - i_begin) * ldg;
      for (int64_t p = 0; p < wg.count; ++p) micro_kernel(isa, d_in, xr, wg.panel(p), g + p * NR, ldg, hg - p * NR);
      for (int ii = 0; ii < kMR; ++ii) {
        T* grow = g + ii * ldg;
        for (int64_t c = 0; c < wg.count * NR; ++c) grow[c] += bg[c];
        activate(isa, a.act, grow, wg.count * NR);
        for (int64_t c = hg; c < hg + NR; ++c) grow[c] = grow[c - hg];
      }
    }

    // No hidden units (h = 0): the down product is empty and the output is the bias alone.
    if (h == 0) std::fill(acc, acc + kRowBlock * ldo, T(0));
    for (int64_t h0 = 0; h0 < h; h0 += kHC) {
      const int64_t hc = std::min(kHC, h - h0);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const T* xr[kMR];
        row_ptrs(a.x + i0 * a.ldx, a.ldx, i_end - i0, xr);
        for (int64_t r0 = h0; r0 < h0 + hc; r0 += NR) {
          T* hp = hid + (i0 - i_begin) * kHC + (r0 - h0);
          micro_kernel(isa, d_in, xr, wu.panel(r0 / NR), hp, kHC, h - r0);
          const T* g = gate + (i0 - i_begin) * ldg + r0 % hg;
          for (int ii = 0; ii < kMR; ++ii)
            for (int jj = 0; jj < NR; jj += VT::kLanes)
              VT::store(hp + ii * kHC + jj, (VT::load(hp + ii * kHC + jj) + VT::load(bu.get() + r0 + jj)) *
                                                VT::load(g + ii * ldg + jj));
        }
      }
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const T* hr[kMR];
        row_ptrs(static_cast<const T*>(hid + (i0 - i_begin) * kHC), kHC, i_end - i0, hr);
        for (int64_t p = 0; p < wd.count; ++p)
          micro_kernel(isa, hc, hr, wd.panel(p) + h0 * NR, acc + (i0 - i_begin) * ldo + p * NR, ldo,
                       d_out - p * NR, /*accumulate=*/h0 > 0);
      }
    }

    for (int64_t i = i_begin; i < i_end; ++i) {
      const T* arow = acc + (i - i_begin) * ldo;
      T* orow = a.out + i * a.ldo;
      if (a.bd) {
        for (int64_t c = 0; c < d_out; ++c) orow[c] = arow[c] + a.bd[c];
      } else {
        std::copy(arow, arow + d_out, orow);
      }
    }
  }, n * ((hg + h) * d_in + h * d_out));
}

template void gated_forward<float>(const GatedForwardArgs<float>&);
template void gated_forward<double>(const GatedForwardArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
