// out = (s s^T) o (p p^T), symmetric: only micro-tiles touching the lower
// triangle are computed; the s- and p-Gram micro-tiles of the same rows are
// multiplied in L1, and the product is written to (i, j) and mirrored to (j, i)
// at once, so the n x n result is written exactly once and never re-read.
#include <utility>
#include <vector>

#include "cpu/common.h"

namespace factkernels {
namespace cpu {

template <typename T> void hadamard_gram(const HadamardGramArgs<T>& a) {
  const int64_t n = a.n;
  if (n <= 0) return;
  constexpr int NR = kNR<T>;
  // Column side packed once (O(n (h + q)), small next to the n^2 (h + q) work).
  const Panels<T> sp = pack_panels(a.s, a.lds, 1, n, a.h);
  const Panels<T> pp = pack_panels(a.p, a.ldp, 1, n, a.q);

  // Cache tiles of kRowBlock rows x kColBlock columns: 16 panels of s and p
  // (~100-200 KB) stay in L2, one panel in L1 across the tile's row micro-panels.
  constexpr int64_t kColBlock = 16 * NR;
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (row block, column block) meeting j <= i
  for (int64_t rb = 0; rb < ceil_div(n, kRowBlock); ++rb) {
    const int64_t i_last = std::min(n, (rb + 1) * kRowBlock) - 1;
    for (int64_t cb = 0; cb * kColBlock <= i_last; ++cb) tiles.emplace_back(rb, cb);
  }

  parallel_tasks(static_cast<int64_t>(tiles.size()), [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
    alignas(64) T cs[kMR * NR];
    alignas(64) T cp[kMR * NR];
    const int64_t i_begin = tiles[t].first * kRowBlock, i_end = std::min(n, i_begin + kRowBlock);
    const int64_t j_begin = tiles[t].second * kColBlock, j_end = std::min(i_end, j_begin + kColBlock);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += NR) {
      const int64_t cols = std::min<int64_t>(NR, n - j0);
      const T* sb = sp.panel(j0 / NR);
      const T* pb = pp.panel(j0 / NR);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
        if (j0 > i0 + rows - 1) continue;  // entirely above the diagonal
        const T* sr[kMR];
        const T* pr[kMR];
        row_ptrs(a.s + i0 * a.lds, a.lds, rows, sr);
        row_ptrs(a.p + i0 * a.ldp, a.ldp, rows, pr);
        micro_kernel(isa, a.h, sr, sb, cs, NR, cols);
        micro_kernel(isa, a.q, pr, pb, cp, NR, cols);
        for (int e = 0; e < kMR * NR; ++e) cs[e] *= cp[e];

        if (j0 + cols - 1 <= i0) {  // whole micro-tile on or below the diagonal
          store_tile(cs, NR, rows, cols, a.out + i0 * a.ldo + j0, a.ldo);
          // Consecutive micro-panels fill the same mirror lines, so they are written while cached
          // (a third of the kernel's time at n = 4,096: skipped when only the lower triangle is asked for).
          if (!a.lower_only)
            for (int64_t jj = 0; jj < cols; ++jj)
              for (int64_t ii = 0; ii < rows; ++ii) a.out[(j0 + jj) * a.ldo + i0 + ii] = cs[ii * NR + jj];
        } else {
          for (int64_t ii = 0; ii < rows; ++ii)
            for (int64_t jj = 0; jj < cols && j0 + jj <= i0 + ii; ++jj) {
              const T v = cs[ii * NR + jj];
              a.out[(i0 + ii) * a.ldo + j0 + jj] = v;
              if (!a.lower_only) a.out[(j0 + jj) * a.ldo + i0 + ii] = v;
            }
        }
      }
    }
  }, n * n / 2 * (a.h + a.q));
}

template void hadamard_gram<float>(const HadamardGramArgs<float>&);
template void hadamard_gram<double>(const HadamardGramArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
