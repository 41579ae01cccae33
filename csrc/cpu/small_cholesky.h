// Small dense Cholesky factors of U*'s corral systems (corral_minor.cpp, corral_solve.cpp): row-major, leading
// dimension ld, ~50 x 50 at d = 128, where torch's batched LAPACK calls run at 1-2 GFLOP/s. Every inner loop
// reads rows of L: reductions go through the vectorized dot (a scalar sum waits on each FMA's latency) and
// the transposed solve runs as row axpys.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/common.h"

namespace factkernels {
namespace cpu {

// Lower Cholesky factor of the m x m matrix A in place; false unless every pivot is positive
// (as LAPACK's potrf: the corral is then affinely dependent up to the ridge).
template <class Isa> FK_INLINE bool cholesky(Isa isa, double* A, int64_t ld, int64_t m) {
  for (int64_t j = 0; j < m; ++j) {
    double* aj = A + j * ld;
    const double s = aj[j] - dot(isa, aj, aj, j);
    if (!(s > 0.0)) return false;
    const double piv = std::sqrt(s);
    aj[j] = piv;
    const double inv = 1.0 / piv;
    for (int64_t i = j + 1; i < m; ++i) {
      double* ai = A + i * ld;
      ai[j] = (ai[j] - dot(isa, ai, aj, j)) * inv;
    }
  }
  return true;
}

// x <- L^{-1} x for the lower factor L (m x m).
template <class Isa> FK_INLINE void forward_solve(Isa isa, const double* L, int64_t ld, int64_t m, double* x) {
  for (int64_t i = 0; i < m; ++i) x[i] = (x[i] - dot(isa, L + i * ld, x, i)) / L[i * ld + i];
}

// x <- (L L^T)^{-1} x for the lower factor L (m x m).
template <class Isa> FK_INLINE void cholesky_solve(Isa isa, const double* L, int64_t ld, int64_t m, double* x) {
  forward_solve(isa, L, ld, m, x);
  for (int64_t i = m - 1; i >= 0; --i) {  // L^T x = b by rows of L: x_i final, then out of the rows above
    const double* li = L + i * ld;
    const double xi = x[i] / li[i];
    x[i] = xi;
    for (int64_t c = 0; c < i; ++c) x[c] -= li[c] * xi;
  }
}

// cholesky_solve with the reciprocals of L's diagonal given (rdiag[i] = 1 / L[i][i]): a product instead of a
// division on each step of the substitutions' dependency chains. The transposed solve takes the rows of L four at
// a time: each x[c] gets the same updates in the same order as row by row, with one load and store of x per four
// (its row axpys were ~0.2 of the whole solves of a U* round at 4,096 x 128).
template <class Isa> FK_INLINE void cholesky_solve(Isa isa, const double* L, int64_t ld, int64_t m, const double* rdiag,
                                                   double* x) {
  for (int64_t i = 0; i < m; ++i) x[i] = (x[i] - dot(isa, L + i * ld, x, i)) * rdiag[i];
  int64_t i = m - 1;
  for (; i >= 3; i -= 4) {
    const double *l0 = L + i * ld, *l1 = l0 - ld, *l2 = l1 - ld, *l3 = l2 - ld;
    const double x0 = x[i] * rdiag[i];
    const double x1 = (x[i - 1] - l0[i - 1] * x0) * rdiag[i - 1];
    const double x2 = ((x[i - 2] - l0[i - 2] * x0) - l1[i - 2] * x1) * rdiag[i - 2];
    const double x3 = (((x[i - 3] - l0[i - 3] * x0) - l1[i - 3] * x1) - l2[i - 3] * x2) * rdiag[i - 3];
    x[i] = x0;
    x[i - 1] = x1;
    x[i - 2] = x2;
    x[i - 3] = x3;
    for (int64_t c = 0; c < i - 3; ++c) x[c] = (((x[c] - l0[c] * x0) - l1[c] * x1) - l2[c] * x2) - l3[c] * x3;
  }
  for (; i >= 0; --i) {
    const double* li = L + i * ld;
    const double xi = x[i] * rdiag[i];
    x[i] = xi;
    for (int64_t c = 0; c < i; ++c) x[c] -= li[c] * xi;
  }
}

// Removes row and column p from the m x m matrix whose lower factor is L: the trailing block absorbs the
// removed column by a rank-1 update (O(m^2) instead of a new O(m^3) factorisation), then everything below
// and right of p moves up and left by one (the factor of the principal submatrix, same ld). w: m scratch.
inline void cholesky_delete(double* L, int64_t ld, int64_t m, int64_t p, double* w) {
  const int64_t t = m - p - 1;
  for (int64_t i = 0; i < t; ++i) w[i] = L[(p + 1 + i) * ld + p];
  for (int64_t k = 0; k < t; ++k) {  // rank-1 update of the trailing factor by w (rotations)
    double* lk = L + (p + 1 + k) * ld + (p + 1);
    const double a = lk[k], b = w[k];
    const double r = std::sqrt(a * a + b * b);
    const double c = r / a, s = b / a;
    lk[k] = r;
    for (int64_t i = k + 1; i < t; ++i) {
      double* li = L + (p + 1 + i) * ld + (p + 1);
      li[k] = (li[k] + s * w[i]) / c;
      w[i] = c * w[i] - s * li[k];
    }
  }
  for (int64_t i = p; i < m - 1; ++i) {  // shift: row i + 1 -> row i, dropping column p
    const double* src = L + (i + 1) * ld;
    double* dst = L + i * ld;
    for (int64_t c = 0; c < p; ++c) dst[c] = src[c];
    for (int64_t c = p; c <= i; ++c) dst[c] = src[c + 1];
  }
}

}  // namespace cpu
}  // namespace factkernels
