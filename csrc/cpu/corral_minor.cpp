// Minor cycles of Wolfe's minimum-norm-point method (the U* corral solver, factkernels/corral.py),
// one corral per row: the affine minimum-norm weights of the corral from a Cholesky factor of its
// system (X_S X_S^T + 1 1^T + ridge I), then a clipped step or Wolfe's line search, until the
// cycle ends. Rows are independent tasks; each factor is ~50 x 50 at d = 128, where torch's
// batched LAPACK calls run at 1-2 GFLOP/s. A dropped point leaves the factor by a rank-1 update
// of its trailing block (O(m^2)) instead of a new factorisation (O(m^3)).
#include <cmath>
#include <vector>

#include "cpu/common.h"
#include "cpu/small_cholesky.h"

namespace factkernels {
namespace cpu {
namespace {

// Per-row scratch: the corral's slots, its factor and vectors of the solve.
struct Scratch {
  std::vector<int64_t> slot;
  std::vector<double> L, M0, z, res, y, w;
  explicit Scratch(int64_t kb) : slot(kb), L(kb * kb), M0(kb * kb), z(kb), res(kb), y(kb), w(kb) {}
};

// The minor cycle of one row (see CorralMinorArgs); returns whether it goes on (not settled).
template <class Isa> FK_INLINE bool minor_cycle(Isa isa, const CorralMinorArgs& a, int64_t row, Scratch& s) {
  const int64_t kb = a.kb, ke = a.ke;
  const double* Q = a.q + row * kb * kb;
  double* lam = a.lam + row * kb;
  uint8_t* occ = a.occ + row * kb;
  if (a.frozen[row]) return false;
  int64_t m = 0;
  for (int64_t k = 0; k < ke; ++k)
    if (occ[k]) s.slot[m++] = k;
  if (m == 0) return false;
  // M0 = Q + 1 on the corral (the unregularised system), L its ridged factor
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) s.M0[i * m + j] = Q[s.slot[i] * kb + s.slot[j]] + 1.0;
  std::copy(s.M0.begin(), s.M0.begin() + m * m, s.L.begin());
  for (int64_t i = 0; i < m; ++i) s.L[i * m + i] += a.ridge;
  if (!cholesky(isa, s.L.data(), m, m)) return false;
  const int64_t steps = a.fast ? 1 : a.max_steps;
  bool again = false;
  for (int64_t step = 0; step < steps; ++step) {
    // affine minimum-norm weights: (M0 + ridge) z = 1, one refinement against M0, y = z / sum(z)
    std::fill(s.z.begin(), s.z.begin() + m, 1.0);
    cholesky_solve(isa, s.L.data(), m, m, s.z.data());
    if (!a.fast) {
      for (int64_t i = 0; i < m; ++i) {
        double t = 1.0;
        const double* mi = s.M0.data() + i * m;
        for (int64_t j = 0; j < m; ++j) t -= mi[j] * s.z[j];
        s.res[i] = t;
      }
      cholesky_solve(isa, s.L.data(), m, m, s.res.data());
      for (int64_t i = 0; i < m; ++i) s.z[i] += s.res[i];
    }
    double zs = 0.0;
    for (int64_t i = 0; i < m; ++i) zs += s.z[i];
    if (!(std::isfinite(zs) && zs > 0.0)) return false;  // keeps the weights, as the twin
    for (int64_t i = 0; i < m; ++i) s.y[i] = s.z[i] / zs;
    // step: clipped (fast) or towards y until the first weight reaches 0 (Wolfe)
    again = false;
    double theta = 1.0;
    int64_t first = -1;
    if (!a.fast) {
      double best = INFINITY;
      for (int64_t i = 0; i < m; ++i) {
        if (s.y[i] > a.eps_w) continue;
        again = true;
        const double l = lam[s.slot[i]];
        const double ratio = l / std::max(l - s.y[i], 1e-300);
        if (ratio < best) {  // the first slot on ties, as torch's min
          best = ratio;
          first = i;
        }
      }
      if (again) theta = std::min(std::max(best, 0.0), 1.0);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      const bool neg = s.y[i] <= a.eps_w;
      double l;
      bool drop;
      if (a.fast) {
        l = neg ? 0.0 : s.y[i];
        drop = neg;
      } else {
        const double old = lam[s.slot[i]];
        l = old + theta * (s.y[i] - old);
        drop = (neg && l <= a.eps_w) || (again && i == first);
      }
      s.w[i] = drop ? -1.0 : std::max(l, 0.0);  // -1 marks a dropped point
      if (!drop) sum += s.w[i];
    }
    for (int64_t k = 0; k < ke; ++k)
      if (!occ[k]) lam[k] = 0.0;
    // new weights; dropped points leave the corral and the factor (last first: indices stay valid)
    for (int64_t i = m - 1; i >= 0; --i) {
      const int64_t k = s.slot[i];
      if (s.w[i] < 0.0) {
        lam[k] = 0.0;
        occ[k] = 0;
      } else {
        lam[k] = sum > 0.0 ? s.w[i] / sum : s.w[i];
      }
    }
    if (!again) break;
    int64_t kept = 0, size = m;  // leading dimension m while deleting; M0 loses the same rows and columns
    for (int64_t i = m - 1; i >= 0; --i) {
      if (s.w[i] >= 0.0) continue;
      cholesky_delete(s.L.data(), m, size, i, s.res.data());
      for (int64_t r = i; r < size - 1; ++r)
        for (int64_t c = 0; c < size; ++c) s.M0[r * m + c] = s.M0[(r + 1) * m + c];
      for (int64_t r = 0; r < size - 1; ++r)
        for (int64_t c = i; c < size - 1; ++c) s.M0[r * m + c] = s.M0[r * m + c + 1];
      --size;
    }
    for (int64_t i = 0; i < m; ++i)
      if (occ[s.slot[i]]) s.slot[kept++] = s.slot[i];
    // repack L and M0 from leading dimension m to kept
    for (int64_t r = 0; r < kept; ++r)
      for (int64_t c = 0; c < kept; ++c) {
        s.L[r * kept + c] = s.L[r * m + c];
        s.M0[r * kept + c] = s.M0[r * m + c];
      }
    m = kept;
    if (m == 0) return false;
  }
  return again;
}

}  // namespace

void corral_minor(const CorralMinorArgs& a) {
  if (a.r <= 0) return;
  const int64_t block = 16;
  const int64_t nblocks = (a.r + block - 1) / block;
  parallel_tasks(
      nblocks,
      [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
        Scratch s(a.kb);
        const int64_t end = std::min(a.r, (t + 1) * block);
        for (int64_t row = t * block; row < end; ++row) a.settled[row] = !minor_cycle(isa, a, row, s);
      },
      a.r * a.ke * a.ke * a.ke);
}

}  // namespace cpu
}  // namespace factkernels
