// Whole minimum-norm-point solves of U*'s candidate stars (the active-set rounds of factkernels/ustar.py),
// one row per task: Wolfe's method with several additions per major cycle on the row's candidate star
// x_k = (v_i - v_k) / ||v_i - v_k||, built in the task's scratch. The corral's vectors, Gram matrix and the
// Cholesky factor of its system (X_S X_S^T + 1 1^T + ridge I) live across the whole solve: an added point
// borders the factor (O(m d + m^2)), a dropped one leaves it by a rank-1 update (O(m^2)); the batched
// torch solver instead gathers, multiplies and factors again per iteration with many small ops.
// A point whose pivot shows it (nearly) in the affine hull of the corral is not added (Wolfe's single
// additions never are; several at once can be, e.g. on lattices), so corrals stay affinely independent.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/common.h"
#include "cpu/small_cholesky.h"

namespace factkernels {
namespace cpu {
namespace {

// Squared pivot below which a second or later point of one addition counts as affinely dependent on the
// corral (generic points sit at O(1); exactly dependent ones at the ridge plus rounding).
constexpr double kDependentPivot2 = 1e-9;
// Candidates ahead whose rows of w the star build asks the cache for (2-6 ran alike, 12 slower).
constexpr int64_t kFetchAhead = 4;

// out[r] = <X[r], b> for the four rows r < 4 of X (leading dimension d): one accumulator per row along b, then its
// lanes in order and the scalar tail.
template <class Isa> FK_INLINE void gemv4(Isa, const double* X, int64_t d, const double* b, double* out) {
  using VT = Vec<double, Isa>;
  constexpr int L = VT::kLanes;
  const double *a0 = X, *a1 = a0 + d, *a2 = a1 + d, *a3 = a2 + d;
  typename VT::type s0{}, s1{}, s2{}, s3{};
  int64_t c = 0;
  for (; c + L <= d; c += L) {
    const auto bv = VT::load(b + c);
    s0 += VT::load(a0 + c) * bv;
    s1 += VT::load(a1 + c) * bv;
    s2 += VT::load(a2 + c) * bv;
    s3 += VT::load(a3 + c) * bv;
  }
  double r0 = 0, r1 = 0, r2 = 0, r3 = 0;
  for (int l = 0; l < L; ++l) {
    r0 += s0[l];
    r1 += s1[l];
    r2 += s2[l];
    r3 += s3[l];
  }
  for (; c < d; ++c) {
    r0 += a0[c] * b[c];
    r1 += a1[c] * b[c];
    r2 += a2[c] * b[c];
    r3 += a3[c] * b[c];
  }
  out[0] = r0;
  out[1] = r1;
  out[2] = r2;
  out[3] = r3;
}

// out[k] = <X[k], b> for k < rows (X row-major with leading dimension d), four rows per pass of b.
template <class Isa> FK_INLINE void gemv(Isa isa, const double* X, int64_t rows, int64_t d, const double* b,
                                         double* out) {
  int64_t k = 0;
  for (; k + 4 <= rows; k += 4) gemv4(isa, X + k * d, d, b, out + k);
  for (; k < rows; ++k) out[k] = dot(isa, X + k * d, b, d);
}

// gemv of X against several vectors: out[t * ld + k] = <X[k], B[t]> for t < count, B[t] = B0 + ks[t] * d, the same
// numbers as gemv for each; four rows of X against every vector in turn, so X streams from L2 once instead of
// once per vector (an addition of 12 points to a corral of ~60).
template <class Isa> FK_INLINE void gemv_many(Isa isa, const double* X, int64_t rows, int64_t d, const double* B0,
                                              const int64_t* ks, int64_t count, double* out, int64_t ld) {
  int64_t k = 0;
  for (; k + 4 <= rows; k += 4)
    for (int64_t t = 0; t < count; ++t) gemv4(isa, X + k * d, d, B0 + ks[t] * d, out + t * ld + k);
  for (; k < rows; ++k)
    for (int64_t t = 0; t < count; ++t) out[t * ld + k] = dot(isa, X + k * d, B0 + ks[t] * d, d);
}

// One task's scratch: the candidate star, the corral (vectors, Gram, factor, weights) and work vectors. The
// methods are forced inline: they are compiled for the ISA of the task body that calls them.
struct Solver {
  const CorralSolveArgs& a;
  const int64_t d, K, mmax;  // mmax = d + 1: an affinely independent corral in R^d
  const int64_t group;  // the most additions of one major cycle
  Buffer<double> X, g, XS, Q, L, rdiag, lam, z, res, y, wv, p, u, QB, LB;
  std::vector<int64_t> S, order;
  std::vector<uint8_t> valid, in_corral;
  int64_t m = 0;  // corral size
  int64_t* steps = nullptr;  // this row's counts (CorralSolveStep), or null

  FK_INLINE void count(CorralSolveStep what, int64_t by = 1) {
    if (steps) steps[what] += by;
  }
  FK_INLINE void grew() {
    count(kAdded);
    if (steps) steps[kLargestCorral] = std::max(steps[kLargestCorral], m);
  }

  explicit Solver(const CorralSolveArgs& args)
      : a(args), d(args.d), K(args.k), mmax(args.d + 1), group(std::max<int64_t>(1, std::max(args.n_init, args.n_add))),
        X(alloc_buffer<double>(args.k * args.d)), g(alloc_buffer<double>(args.k)),
        XS(alloc_buffer<double>(mmax * d)), Q(alloc_buffer<double>(mmax * mmax)),
        L(alloc_buffer<double>(mmax * mmax)), rdiag(alloc_buffer<double>(mmax)), lam(alloc_buffer<double>(mmax)),
        z(alloc_buffer<double>(mmax)),
        res(alloc_buffer<double>(mmax)), y(alloc_buffer<double>(mmax)), wv(alloc_buffer<double>(mmax)),
        p(alloc_buffer<double>(d)), u(alloc_buffer<double>(d)),
        QB(alloc_buffer<double>(std::max<int64_t>(1, std::max(args.n_init, args.n_add)) * mmax)),
        LB(alloc_buffer<double>(std::max<int64_t>(1, std::max(args.n_init, args.n_add)) * mmax)), S(mmax),
        order(args.k), valid(args.k), in_corral(args.k) {}

  // Borders the corral with candidate k if its pivot exceeds min_pivot2; weight 0.
  template <class Isa> FK_INLINE bool add(Isa isa, int64_t k, double min_pivot2) {
    if (m >= mmax) return false;
    const double* x = X.get() + k * d;
    double* q = wv.get();
    gemv(isa, XS.get(), m, d, x, q);
    const double qkk = dot(isa, x, x, d);
    double* l = res.get();
    for (int64_t s = 0; s < m; ++s) l[s] = q[s] + 1.0;
    forward_solve(isa, L.get(), mmax, m, l);
    double piv2 = qkk + 1.0 + a.ridge;
    for (int64_t s = 0; s < m; ++s) piv2 -= l[s] * l[s];
    if (!(piv2 > min_pivot2)) return false;
    double* lm = L.get() + m * mmax;
    for (int64_t s = 0; s < m; ++s) {
      lm[s] = l[s];
      Q[m * mmax + s] = Q[s * mmax + m] = q[s];
    }
    lm[m] = std::sqrt(piv2);
    Q[m * mmax + m] = qkk;
    std::copy(x, x + d, XS.get() + m * d);
    lam[m] = 0.0;
    S[m] = k;
    in_corral[k] = 1;
    ++m;
    grew();
    return true;
  }

  // Borders the corral with the candidates ks[0, count) in turn, as add() one by one (the first with no pivot test
  // unless one is added already): their products with the corral as it stands and those rows' forward
  // substitutions first, for all of them at once (independent dot products, where one by one each substitution
  // waits on the last: the additions were 0.45 of a cold round's cycles at 4,096 x 128), then each one's entries
  // for the points added before it in this call. Returns how many were added.
  template <class Isa> FK_INLINE int64_t add_all(Isa isa, const int64_t* ks, int64_t count) {
    const int64_t m0 = m;
    count = std::min(count, group);
    gemv_many(isa, XS.get(), m0, d, X.get(), ks, count, QB.get(), mmax);
    for (int64_t b = 0; b < count; ++b) {
      const double* q = QB.get() + b * mmax;
      double* l = LB.get() + b * mmax;
      for (int64_t s = 0; s < m0; ++s) l[s] = q[s] + 1.0;
    }
    for (int64_t i = 0; i < m0; ++i) {
      const double* li = L.get() + i * mmax;
      for (int64_t b = 0; b < count; ++b) {
        double* l = LB.get() + b * mmax;
        l[i] = (l[i] - dot(isa, li, l, i)) / li[i];
      }
    }
    for (int64_t b = 0; b < count && m < mmax; ++b) {
      const double* x = X.get() + ks[b] * d;
      double* q = QB.get() + b * mmax;
      double* l = LB.get() + b * mmax;
      for (int64_t s = m0; s < m; ++s) {  // the points added in this call
        q[s] = dot(isa, XS.get() + s * d, x, d);
        l[s] = (q[s] + 1.0 - dot(isa, L.get() + s * mmax, l, s)) / L[s * mmax + s];
      }
      double piv2 = dot(isa, x, x, d) + 1.0 + a.ridge;
      for (int64_t s = 0; s < m; ++s) piv2 -= l[s] * l[s];
      if (!(piv2 > (m == m0 ? 0.0 : kDependentPivot2))) continue;
      double* lm = L.get() + m * mmax;
      for (int64_t s = 0; s < m; ++s) {
        lm[s] = l[s];
        Q[m * mmax + s] = Q[s * mmax + m] = q[s];
      }
      lm[m] = std::sqrt(piv2);
      Q[m * mmax + m] = dot(isa, x, x, d);
      std::copy(x, x + d, XS.get() + m * d);
      lam[m] = 0.0;
      S[m] = ks[b];
      in_corral[ks[b]] = 1;
      ++m;
      grew();
    }
    return m - m0;
  }

  // Factors a whole warm corral (XS, S and in_corral hold its m points) at once: the Gram, then the Cholesky factor
  // of Q + 1 1^T + ridge I column by column (its dot products independent of each other, where bordering point by
  // point waits on each forward substitution: 0.33 of 1.0 G cycles of a warm round at 4,096 x 128). The same
  // factor up to rounding; false (nothing kept) where a pivot shows a point (nearly) dependent on those before.
  template <class Isa> FK_INLINE bool factor_all(Isa isa) {
    for (int64_t s = 0; s < m; ++s) {
      gemv(isa, XS.get(), s + 1, d, XS.get() + s * d, wv.get());
      for (int64_t t = 0; t <= s; ++t) {
        Q[s * mmax + t] = Q[t * mmax + s] = wv[t];
        L[s * mmax + t] = wv[t] + 1.0;
      }
      L[s * mmax + s] += a.ridge;
    }
    for (int64_t j = 0; j < m; ++j) {
      double* lj = L.get() + j * mmax;
      const double piv2 = lj[j] - dot(isa, lj, lj, j);
      if (!(piv2 > kDependentPivot2)) return false;
      lj[j] = std::sqrt(piv2);
      for (int64_t i = j + 1; i < m; ++i) {
        double* li = L.get() + i * mmax;
        li[j] = (li[j] - dot(isa, li, lj, j)) / lj[j];
      }
    }
    return true;
  }

  // Drops corral member i (factor by a rank-1 update; Gram, vectors, weights and slots shift down).
  FK_INLINE void remove(int64_t i) {
    count(kDrops);
    count(kRotations, m - i - 1);  // also the factor's rows that move up
    cholesky_delete(L.get(), mmax, m, i, z.get());
    for (int64_t r = i; r < m - 1; ++r)
      for (int64_t c = 0; c < m; ++c) Q[r * mmax + c] = Q[(r + 1) * mmax + c];
    for (int64_t r = 0; r < m - 1; ++r)
      for (int64_t c = i; c < m - 1; ++c) Q[r * mmax + c] = Q[r * mmax + c + 1];
    std::copy(XS.get() + (i + 1) * d, XS.get() + m * d, XS.get() + i * d);
    in_corral[S[i]] = 0;
    for (int64_t r = i; r < m - 1; ++r) {
      S[r] = S[r + 1];
      lam[r] = lam[r + 1];
    }
    --m;
  }

  // Wolfe's minor cycle: affine minimum-norm weights y of the corral ((Q + 1 1^T + ridge I) z = 1, one
  // refinement against the system without ridge, y = z / sum z); while some y_i <= eps_w, move towards y
  // until the first weight reaches 0 and drop it (and every weight left at 0). Ends at y > 0 on the corral. The
  // substitutions multiply by the diagonal's reciprocals (a division on their dependency chains was ~0.2 of the
  // cycle; U* at 4,096 x 128: the same float32 U and radii).
  template <class Isa> FK_INLINE void minor(Isa isa) {
    for (int64_t step = 0, most = m + 2; step < most && m > 0; ++step) {
      count(kMinorSteps);
      count(kSolveRows, m);
      for (int64_t i = 0; i < m; ++i) rdiag[i] = 1.0 / L[i * mmax + i];
      for (int64_t i = 0; i < m; ++i) z[i] = 1.0;
      cholesky_solve(isa, L.get(), mmax, m, rdiag.get(), z.get());
      double zsum = 0.0;
      for (int64_t j = 0; j < m; ++j) zsum += z[j];
      for (int64_t i = 0; i < m; ++i) res[i] = 1.0 - zsum - dot(isa, Q.get() + i * mmax, z.get(), m);
      cholesky_solve(isa, L.get(), mmax, m, rdiag.get(), res.get());
      double zs = 0.0;
      for (int64_t i = 0; i < m; ++i) {
        z[i] += res[i];
        zs += z[i];
      }
      if (!(std::isfinite(zs) && zs > 0.0)) return;  // keeps the weights, as the twin
      double best = INFINITY;
      int64_t first = -1;
      for (int64_t i = 0; i < m; ++i) {
        y[i] = z[i] / zs;
        if (y[i] > a.eps_w) continue;
        const double ratio = lam[i] / std::max(lam[i] - y[i], 1e-300);
        if (ratio < best) {  // the first slot on ties, as torch's min
          best = ratio;
          first = i;
        }
      }
      if (first < 0) {
        std::copy(y.get(), y.get() + m, lam.get());
        return;
      }
      const double theta = std::min(std::max(best, 0.0), 1.0);
      double sum = 0.0;
      for (int64_t i = 0; i < m; ++i) {
        const double l = lam[i] + theta * (y[i] - lam[i]);
        const bool drop = (y[i] <= a.eps_w && l <= a.eps_w) || i == first;
        wv[i] = drop ? -1.0 : std::max(l, 0.0);  // -1 marks a dropped point
        if (!drop) sum += wv[i];
      }
      for (int64_t i = 0; i < m; ++i) lam[i] = wv[i] < 0.0 ? -1.0 : (sum > 0.0 ? wv[i] / sum : wv[i]);
      for (int64_t i = m - 1; i >= 0; --i)  // last first: the positions below stay valid
        if (lam[i] < 0.0) remove(i);
    }
  }

  template <class Isa> FK_INLINE void solve(Isa isa, int64_t row) {
    const CorralSolveArgs& A = a;
    const int64_t i = A.rows[row];
    const double* wi = A.w + i * d;
    const int64_t* cand = A.cand + row * K;
    steps = A.steps ? A.steps + row * kCorralSolveSteps : nullptr;
    if (steps) std::fill(steps, steps + kCorralSolveSteps, int64_t{0});
    // the candidate star, exact differences (a zero difference is a duplicated value: no valid direction)
    bool dup = false;
    // the candidates are scattered rows of w (L2 misses, most of the star's time): each is fetched kFetchAhead
    // candidates ahead (round 1 at 4,096 x 128: 0.39-0.41 CPU s against 0.43-0.45 without)
    const int64_t row_bytes = d * int64_t(sizeof(double));
    for (int64_t k = 0; k < std::min(K, kFetchAhead); ++k)
      if (cand[k] >= 0) prefetch_bytes(A.w + cand[k] * d, row_bytes);
    for (int64_t k = 0; k < K; ++k) {
      if (k + kFetchAhead < K && cand[k + kFetchAhead] >= 0) prefetch_bytes(A.w + cand[k + kFetchAhead] * d, row_bytes);
      double* x = X.get() + k * d;
      valid[k] = 0;
      in_corral[k] = 0;
      const int64_t j = cand[k];
      if (j < 0) {
        std::fill(x, x + d, 0.0);
        continue;
      }
      const double* wj = A.w + j * d;
      for (int64_t c = 0; c < d; ++c) x[c] = wi[c] - wj[c];
      const double nrm = std::sqrt(dot(isa, x, x, d));
      if (nrm > 0.0) {
        const double inv = 1.0 / nrm;
        for (int64_t c = 0; c < d; ++c) x[c] *= inv;
        valid[k] = 1;
      } else {
        dup = true;
      }
    }
    // the warm corral (positions into cand), factored whole; its weights restart the line search
    m = 0;
    for (int64_t t = 0; t < A.kw && m < mmax; ++t) {
      const int64_t k = A.warm_cols ? A.warm_cols[row * A.kw + t] : -1;
      if (k < 0 || k >= K || !valid[k] || in_corral[k]) continue;
      std::copy(X.get() + k * d, X.get() + (k + 1) * d, XS.get() + m * d);
      lam[m] = std::max(A.warm_lam[row * A.kw + t], 0.0);
      S[m++] = k;
      in_corral[k] = 1;
    }
    if (!factor_all(isa)) {  // a dependent point: border one by one, leaving such points out
      for (int64_t s = 0; s < m; ++s) in_corral[S[s]] = 0;
      const int64_t m0 = m;
      std::copy(lam.get(), lam.get() + m0, y.get());
      std::vector<int64_t> ks(S.begin(), S.begin() + m0);
      m = 0;
      for (int64_t t = 0; t < m0; ++t)
        if (add(isa, ks[t], kDependentPivot2)) lam[m - 1] = y[t];
    }
    if (steps) {  // the warm corral factored whole counts as its additions
      steps[kWarmCorral] = m;
      if (steps[kAdded] == 0) {
        steps[kAdded] = m;
        steps[kLargestCorral] = m;
      }
    }
    double wsum = 0.0;
    for (int64_t s = 0; s < m; ++s) wsum += lam[s];
    if (m > 0) {
      for (int64_t s = 0; s < m; ++s) lam[s] = wsum > 0.0 ? lam[s] / wsum : 1.0 / static_cast<double>(m);
      minor(isa);
    }
    const double* start = A.start + row * d;
    double best_lo = -INFINITY, best_hi = INFINITY, prev_pp = INFINITY;
    {
      double sn = std::sqrt(dot(isa, start, start, d));
      for (int64_t c = 0; c < d; ++c) u[c] = start[c] / std::max(sn, 1e-300);
    }
    for (int64_t it = 0;; ++it) {
      count(kMajorCycles);
      // the point: the corral's hull point, or the start direction before the first addition
      const bool hull = m > 0;
      if (hull) {
        std::fill(p.get(), p.get() + d, 0.0);
        for (int64_t s = 0; s < m; ++s) {
          const double l = lam[s];
          const double* xs = XS.get() + s * d;
          for (int64_t c = 0; c < d; ++c) p[c] += l * xs[c];
        }
      } else {
        std::copy(start, start + d, p.get());
      }
      // certificate against every candidate: g_k = <x_k, p>
      gemv(isa, X.get(), K, d, p.get(), g.get());
      double gmin = INFINITY;
      for (int64_t k = 0; k < K; ++k)
        if (valid[k] && g[k] < gmin) gmin = g[k];
      const double pp = dot(isa, p.get(), p.get(), d), pn = std::sqrt(pp);
      double lo = pn > 0.0 ? gmin / pn : -INFINITY;
      if (!std::isfinite(gmin)) lo = 1.0;  // no other value
      if (lo > best_lo) {
        best_lo = lo;
        if (pn > 0.0)
          for (int64_t c = 0; c < d; ++c) u[c] = p[c] / pn;
      }
      if (hull) {
        best_hi = std::min(best_hi, pn);
        // certified, at 0, or stalled (a Wolfe major cycle lowers ||p|| unless rounding stops it)
        if (pp - gmin <= A.tol * pp || pp <= A.zero_norm2 || !std::isfinite(gmin) || pp >= prev_pp * (1.0 - 1e-14))
          break;
        prev_pp = pp;
      }
      if (it >= A.max_iter) break;
      // additions: the most violating candidates outside the corral, the first one without the pivot test
      const int64_t want = hull ? A.n_add : A.n_init;
      const double thr = hull ? pp * (1.0 - 0.5 * A.tol) : INFINITY;
      int64_t count = 0;
      for (int64_t k = 0; k < K; ++k)
        if (valid[k] && !in_corral[k] && g[k] < thr) order[count++] = k;
      const int64_t take = std::min(count, want);
      std::partial_sort(order.begin(), order.begin() + take, order.begin() + count,
                        [&](int64_t x, int64_t y) { return g[x] < g[y] || (g[x] == g[y] && x < y); });
      const int64_t before = m;
      add_all(isa, order.data(), take);
      if (m == before) break;  // nothing to add: the point stays (its certificate is what it is)
      if (!hull) lam[0] = 1.0;  // a cold start begins at the most violating point
      minor(isa);
      if (m == 0) break;
    }
    double* uo = A.u + row * d;
    std::copy(u.get(), u.get() + d, uo);
    A.lo[row] = best_lo;
    A.hi[row] = best_hi;
    A.dup[row] = dup ? 1 : 0;
    for (int64_t s = 0; s < A.kc; ++s) {
      A.out_cols[row * A.kc + s] = s < m ? S[s] : -1;
      A.out_lam[row * A.kc + s] = s < m ? lam[s] : 0.0;
    }
  }
};

}  // namespace

void corral_solve(const CorralSolveArgs& a) {
  if (a.r <= 0) return;
  const int64_t block = 8;
  parallel_tasks(
      ceil_div(a.r, block),
      [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
        Solver s(a);
        for (int64_t row = t * block, end = std::min(a.r, (t + 1) * block); row < end; ++row) s.solve(isa, row);
      },
      a.r * a.k * a.d * 16);
}

}  // namespace cpu
}  // namespace factkernels
