// Matrix-free products with the gadget operator M (row i = s_i (x) p_i) for
// m right-hand sides; M is never formed.
#include "cpu/common.h"

namespace factkernels {
namespace cpu {

// matvec: out[i, j] = s_i . T[i, j h : j h + h] with T = p coef^T, coef viewed
// as (m h) x q. T is produced one micro-panel of rows at a time into a small
// buffer, so the s-reduction is a contiguous dot product.
template <typename T> void gadget_matvec(const GadgetProductArgs<T>& a) {
  const int64_t n = a.n, h = a.h, q = a.q, m = a.m;
  if (n <= 0 || m <= 0) return;
  constexpr int NR = kNR<T>;
  // coef packed in blocks of whole j's, ~256 rows of q each, so a block stays in L2.
  const int64_t jb = std::max<int64_t>(1, 256 / std::max<int64_t>(h, 1));  // h = 0: every dot is empty (0)
  const int64_t nblk = ceil_div(m, jb);
  const int64_t blk_panels = ceil_div(jb * h, NR);
  const Buffer<T> coef = alloc_buffer<T>(nblk * blk_panels * NR * q);
  parallel_tasks(nblk * blk_panels, [&](int64_t t, int, auto) FK_LAMBDA_INLINE {
    const int64_t blk = t / blk_panels, p = t % blk_panels;
    const int64_t rows_left = std::min(jb, m - blk * jb) * h - p * NR;
    if (rows_left > 0)
      pack_panel(a.in + (blk * jb * h + p * NR) * q, q, 1, std::min<int64_t>(NR, rows_left), q,
                 coef.get() + t * NR * q);
  }, m * h * q);

  const int64_t ldt = blk_panels * NR;
  const Buffer<T> scratch = alloc_buffer<T>(num_threads() * kMR * ldt);
  parallel_tasks(ceil_div(n, kRowBlock), [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    T* tbuf = scratch.get() + tid * kMR * ldt;
    const int64_t i_end = std::min(n, (t + 1) * kRowBlock);
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t j0 = blk * jb, nj = std::min(jb, m - j0);
      const int64_t np = ceil_div(nj * h, NR);
      const T* cb = coef.get() + blk * blk_panels * NR * q;
      for (int64_t i0 = t * kRowBlock; i0 < i_end; i0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
        const T* pr[kMR];
        row_ptrs(a.p + i0 * a.ldp, a.ldp, rows, pr);
        for (int64_t pn = 0; pn < np; ++pn)
          micro_kernel(isa, q, pr, cb + pn * NR * q, tbuf + pn * NR, ldt, nj * h - pn * NR);
        for (int64_t ii = 0; ii < rows; ++ii) {
          const T* srow = a.s + (i0 + ii) * a.lds;
          T* orow = a.out + (i0 + ii) * a.ldy + j0;
          for (int64_t jj = 0; jj < nj; ++jj) orow[jj] = dot(isa, srow, tbuf + ii * ldt + jj * h, h);
        }
      }
    }
  }, n * m * h * q);
}

// dst (cols x rows, contiguous) = src^T for src (rows x cols, leading dimension ld).
template <typename T> Buffer<T> transpose(const T* src, int64_t ld, int64_t rows, int64_t cols) {
  Buffer<T> dst = alloc_buffer<T>(rows * cols);
  // Blocks of kBlock source rows (read from L1) written as contiguous runs of
  // dst, rather than column by column at a large power-of-two-ish stride.
  constexpr int64_t kBlock = 64;
  parallel_tasks(ceil_div(rows, kBlock), [&](int64_t t, int, auto) FK_LAMBDA_INLINE {
    const int64_t i0 = t * kBlock, i1 = std::min(rows, i0 + kBlock);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t i = i0; i < i1; ++i) dst[c * rows + i] = src[i * ld + c];
  }, rows * cols);
  return dst;
}

// rmatvec: out (m h x q) = W^T p with W[i, j h + r] = y[i, j] s[i, r]. The
// reduction runs over i, so p is packed as column panels along i, and the
// rows of W^T are built on the fly (contiguous products of the transposed y
// and s) one KC-chunk of i at a time. Tasks own output rows: no atomics.
template <typename T> void gadget_rmatvec(const GadgetProductArgs<T>& a) {
  const int64_t n = a.n, h = a.h, q = a.q, m = a.m, rows_out = m * h;
  if (rows_out <= 0 || q <= 0) return;
  constexpr int NR = kNR<T>;
  constexpr int64_t KC = 256;  // an A micro-panel and one p panel chunk (16 KB) fit in L1
  const Panels<T> pp = pack_panels(a.p, 1, a.ldp, q, n);
  const Buffer<T> st = transpose(a.s, a.lds, n, h);
  const Buffer<T> yt = transpose(a.in, a.ldy, n, m);

  const int64_t ngp = ceil_div(rows_out, kMR);
  const int64_t per_task = std::clamp<int64_t>(ngp / (4 * num_threads()), 1, 16);  // micro-panels
  const int64_t ldacc = pp.count * NR;
  const int64_t per_thread = kMR * KC + per_task * kMR * ldacc;
  const Buffer<T> scratch = alloc_buffer<T>(num_threads() * per_thread);
  parallel_tasks(ceil_div(ngp, per_task), [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    T* wrows = scratch.get() + tid * per_thread;
    T* acc = wrows + kMR * KC;
    const int64_t g_begin = t * per_task * kMR, g_end = std::min(rows_out, g_begin + per_task * kMR);
    std::fill(acc, acc + per_task * kMR * ldacc, T(0));
    for (int64_t i0 = 0; i0 < n; i0 += KC) {
      const int64_t kc = std::min(KC, n - i0);
      for (int64_t g0 = g_begin; g0 < g_end; g0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, g_end - g0);
        for (int64_t ii = 0; ii < rows; ++ii) {
          const T* yr = yt.get() + ((g0 + ii) / h) * n + i0;
          const T* sr = st.get() + ((g0 + ii) % h) * n + i0;
          T* w = wrows + ii * KC;
          for (int64_t kk = 0; kk < kc; ++kk) w[kk] = yr[kk] * sr[kk];
        }
        const T* wr[kMR];
        row_ptrs(static_cast<const T*>(wrows), KC, rows, wr);
        T* c = acc + (g0 - g_begin) * ldacc;
        for (int64_t pc = 0; pc < pp.count; ++pc)
          micro_kernel(isa, kc, wr, pp.panel(pc) + i0 * NR, c + pc * NR, ldacc, q - pc * NR, /*accumulate=*/true);
      }
    }
    store_tile(acc, ldacc, g_end - g_begin, q, a.out + g_begin * q, q);
  }, n * m * h * q);
}

template void gadget_matvec<float>(const GadgetProductArgs<float>&);
template void gadget_matvec<double>(const GadgetProductArgs<double>&);
template void gadget_rmatvec<float>(const GadgetProductArgs<float>&);
template void gadget_rmatvec<double>(const GadgetProductArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
