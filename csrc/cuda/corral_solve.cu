// Whole minimum-norm-point solves of U*'s candidate stars on a GPU, one WARP per row: the port of
// csrc/cpu/corral_solve.cpp (Wolfe's method, several additions per major cycle, the corral's Cholesky factor
// bordered on add and downdated on drop, the same pivot test, minor cycle and termination rules), so that an
// active-set round of factkernels/ustar.py is one launch instead of the batched torch solver's thousands of
// small ops. Warps take rows from a counter until none is left; each keeps its row's candidate star (K x d,
// row-major as on the CPU), the corral's Gram matrix and factor (mmax x mmax, mmax = d + 1) and work vectors in
// its own slice of a global workspace; corral members are indices into the star (no copies). A star row is read
// whole by the warp (the hull point, a border's norm: coalesced) or by one lane (a certificate, a border's
// products: consecutive elements of one row in consecutive steps, so each sector serves four through L1).
//
// Warp-synchronous code: lane-strided loops, every decision computed from warp reductions (a butterfly gives
// all lanes the same bits) so control flow is warp-uniform. Element s of a slot vector (lam, z, res, y, wv) and
// element c of p, u is read and written only by lane s % 32 (c % 32) inside loops; where a lane reads what
// another lane wrote, a __syncwarp() comes first (the triangular solves' pivots and the rotations go through
// shuffles instead).
#include <math.h>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;
// As the CPU kernel: the squared pivot below which a second or later point of one addition counts as affinely
// dependent on the corral.
constexpr double kDependentPivot2 = 1e-9;
enum : uint8_t { kValid = 1, kInCorral = 2 };  // per-candidate flags

// std::max / std::min semantics (the first argument when unordered), as the CPU kernel's.
__device__ __forceinline__ double max_of(double a, double b) { return a < b ? b : a; }
__device__ __forceinline__ double min_of(double a, double b) { return b < a ? b : a; }

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Two warp_sums in one butterfly (their shuffles independent: one chain of five steps, not two).
__device__ __forceinline__ void warp_sum2(double& v, double& w) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v += __shfl_xor_sync(kFull, v, o);
    w += __shfl_xor_sync(kFull, w, o);
  }
}

__device__ __forceinline__ double warp_min(double v) {  // v never NaN here
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmin(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// The smallest (v, i) in lexicographic order over the warp (the lowest index on ties, as the CPU's sort
// comparator and torch's min); (inf, -1) stands for none.
__device__ __forceinline__ void warp_argmin(double& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, i, o);
    if (ov < v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// dst[c] = src[c + (c >= p)] for c < n (drops entry p; dst may be src, or a row above it): up to 128 entries are
// read into registers, then written after a __syncwarp. No __syncwarp after the writes: the reads of a later call
// on rows below are ordered by its own, and a caller syncs before other lanes read what was written.
template <typename T> __device__ __forceinline__ void copy_dropping(T* dst, const T* src, int n, int p, int lane) {
  constexpr int kStage = 4;
  for (int base = 0; base < n; base += 32 * kStage) {
    T v[kStage];
#pragma unroll
    for (int j = 0; j < kStage; ++j) {
      const int c = base + 32 * j + lane;
      v[j] = c < n ? src[c + (c >= p ? 1 : 0)] : T{};
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kStage; ++j) {
      const int c = base + 32 * j + lane;
      if (c < n) dst[c] = v[j];
    }
  }
}

// One warp's solver over its scratch slice (see corral_solve_scratch in kernels.h for the layout).
struct RowSolver {
  const CorralSolveArgs& a;
  const int lane;
  const int d, K, mmax;  // mmax = d + 1: an affinely independent corral in R^d
  double *X, *g, *Q, *L, *lam, *z, *res, *y, *wv, *p, *u, *qg, *qs;
  int* S;           // corral slot -> candidate
  uint8_t* flags;   // kValid | kInCorral per candidate
  int m = 0;        // corral size (the same in every lane)

  // work: the warp's scratch slice; slot_vectors: where its five slot vectors live (shared memory, or their place
  // in work)
  __device__ RowSolver(const CorralSolveArgs& args, int lane_, double* work, double* slot_vectors)
      : a(args), lane(lane_), d(static_cast<int>(args.d)), K(static_cast<int>(args.k)),
        mmax(static_cast<int>(args.d) + 1) {
    double* w = work;
    X = w;  // the star: x_k[c] = X[k * d + c]
    w += static_cast<int64_t>(K) * d;
    g = w;
    w += K;
    Q = w;
    w += static_cast<int64_t>(mmax) * mmax;
    L = w;
    w += static_cast<int64_t>(mmax) * mmax;
    lam = slot_vectors;
    z = lam + mmax;
    res = z + mmax;
    y = res + mmax;
    wv = y + mmax;
    w += 5 * mmax;
    p = w;
    u = w + d;
    w += 2 * d;
    qg = w;  // a group of additions' products with the corral: kCorralSolveGroup x mmax
    w += static_cast<int64_t>(kCorralSolveGroup) * mmax;
    qs = w;  // the same plus 1, forward-solved: the group's borders of L
    w += static_cast<int64_t>(kCorralSolveGroup) * mmax;
    S = reinterpret_cast<int*>(w);
    w += mmax;
    flags = reinterpret_cast<uint8_t*>(w);
  }

  __device__ __forceinline__ double xs(int k, int c) const { return X[static_cast<int64_t>(k) * d + c]; }

  // x <- L^{-1} x (n x n) by blocks of 32 rows, a lane per row: each lane first takes its row's products with the
  // solution of the blocks above (rows of L read by one lane each), then the block's own rows are solved in turn,
  // each x_i broadcast by one shuffle (a warp dot product per row would cost five). Rows below from are solved
  // already (blocks then start at from: x[r] is written by lane (r - from) % 32, hence the closing __syncwarp).
  __device__ void forward_solve(int n, double* x, int from = 0) {
    for (int b = from; b < n; b += 32) {
      __syncwarp();  // every lane reads the x of the blocks above
      const int r = b + lane;  // this lane's row (x[r]'s owner)
      const double* lr = L + static_cast<int64_t>(r) * mmax;
      // the reciprocal pivot, computed before the chain of steps (a division in each step would double its latency)
      double acc = 0.0, xr = 0.0, rdiag = 1.0;
      if (r < n) {
        for (int c = 0; c < b; ++c) acc += lr[c] * x[c];
        xr = x[r];
        rdiag = 1.0 / lr[r];
      }
      const int rows = n - b < 32 ? n - b : 32;
      for (int i = 0; i < rows; ++i) {
        double xi = 0.0;
        if (lane == i) {
          xi = (xr - acc) * rdiag;
          xr = xi;
        }
        xi = __shfl_sync(kFull, xi, i);
        if (lane > i && r < n) acc += lr[b + i] * xi;
      }
      if (r < n) x[r] = xr;
    }
    if (from & 31) __syncwarp();
  }

  // forward_solve on several right-hand sides at once, x_v = xg + v * mmax for v < nrhs: one chain of steps whose
  // shuffles are independent across v (the chain's latency paid once, not nrhs times). Each x_v's arithmetic is
  // forward_solve's, in the same order. x_v[r] is read and written by lane r % 32. Not inlined: in the solver's
  // body it pushed the 128-register bound into spills (ptxas: 136 bytes of spill stores; none this way).
  __device__ __noinline__ void forward_solve_group(int n, double* xg, int nrhs) {
    for (int b = 0; b < n; b += 32) {
      __syncwarp();  // every lane reads the x of the blocks above
      const int r = b + lane;
      const double* lr = L + static_cast<int64_t>(r) * mmax;
      double acc[kCorralSolveGroup], xr[kCorralSolveGroup], rdiag = 1.0;
#pragma unroll
      for (int v = 0; v < kCorralSolveGroup; ++v) acc[v] = xr[v] = 0.0;
      if (r < n) {
        for (int c = 0; c < b; ++c) {
          const double l = lr[c];
#pragma unroll
          for (int v = 0; v < kCorralSolveGroup; ++v)
            if (v < nrhs) acc[v] += l * xg[static_cast<int64_t>(v) * mmax + c];
        }
#pragma unroll
        for (int v = 0; v < kCorralSolveGroup; ++v)
          if (v < nrhs) xr[v] = xg[static_cast<int64_t>(v) * mmax + r];
        rdiag = 1.0 / lr[r];
      }
      const int rows = n - b < 32 ? n - b : 32;
      for (int i = 0; i < rows; ++i) {
        const double l = lane > i && r < n ? lr[b + i] : 0.0;
#pragma unroll
        for (int v = 0; v < kCorralSolveGroup; ++v) {
          if (v >= nrhs) continue;  // warp-uniform
          double xi = 0.0;
          if (lane == i) {
            xi = (xr[v] - acc[v]) * rdiag;
            xr[v] = xi;
          }
          xi = __shfl_sync(kFull, xi, i);
          if (lane > i && r < n) acc[v] += l * xi;
        }
      }
      if (r < n)
#pragma unroll
        for (int v = 0; v < kCorralSolveGroup; ++v)
          if (v < nrhs) xg[static_cast<int64_t>(v) * mmax + r] = xr[v];
    }
  }

  // x <- L^{-T} x (n x n): forward_solve's scheme on L^T, blocks of 32 rows from the last one up, a lane per row
  // (x[r]'s owner): each lane first takes its row's products with the solution of the blocks below (column r of
  // L, read across lanes in consecutive addresses), then the block's rows are solved from the bottom, each x_i
  // broadcast by one shuffle. A step's chain is a multiply-add and a shuffle: no shared-memory round trip (the
  // loop this replaced updated x in shared memory and read it back every step).
  __device__ void backward_solve(int n, double* x) {
    for (int b = (n - 1) & ~31; b >= 0; b -= 32) {
      __syncwarp();  // every lane reads the x of the blocks below
      const int e = n - b < 32 ? n : b + 32;  // the block: rows [b, e)
      const int r = b + lane;
      double acc = 0.0, xr = 0.0, rdiag = 1.0;
      if (r < e) {
        for (int c = n - 1; c >= e; --c) acc += L[static_cast<int64_t>(c) * mmax + r] * x[c];
        xr = x[r];
        rdiag = 1.0 / L[static_cast<int64_t>(r) * (mmax + 1)];
      }
      for (int i = e - 1; i >= b; --i) {
        const double l = r < i ? L[static_cast<int64_t>(i) * mmax + r] : 0.0;
        double xi = 0.0;
        if (lane == i - b) {
          xi = (xr - acc) * rdiag;
          xr = xi;
        }
        xi = __shfl_sync(kFull, xi, i - b);
        if (r < i) acc += l * xi;
      }
      if (r < e) x[r] = xr;
    }
  }

  // x <- (L L^T)^{-1} x. Not inlined (the minor cycle calls it twice): inlined, ptxas spilled 88 bytes at the
  // 128-register bound; as a call, 8.
  __device__ __noinline__ void cholesky_solve(int n, double* x) {
    forward_solve(n, x);
    backward_solve(n, x);
  }

  // Removes row and column pos from the m x m system whose factor is L (rotations into the trailing block,
  // then everything below and right of pos moves up and left by one). z: scratch.
  __device__ void cholesky_delete(int pos) {
    const int t = m - pos - 1;
    __syncwarp();
    for (int i = lane; i < t; i += 32) z[i] = L[static_cast<int64_t>(pos + 1 + i) * mmax + pos];
    for (int k = 0; k < t; ++k) {
      double c = 0.0, s = 0.0;
      if (lane == (k & 31)) {  // the owner of w_k (z[k]); the diagonal is untouched by the rotations before
        double* lk = L + static_cast<int64_t>(pos + 1 + k) * mmax + (pos + 1);
        const double aa = lk[k], b = z[k];
        const double r = sqrt(aa * aa + b * b);
        c = r / aa;
        s = b / aa;
        lk[k] = r;
      }
      c = __shfl_sync(kFull, c, k & 31);
      s = __shfl_sync(kFull, s, k & 31);
      for (int i = lane; i < t; i += 32) {  // i = lane mod 32: the owner of z[i]
        if (i <= k) continue;
        double* li = L + static_cast<int64_t>(pos + 1 + i) * mmax + (pos + 1);
        li[k] = (li[k] + s * z[i]) / c;
        z[i] = c * z[i] - s * li[k];
      }
    }
    __syncwarp();
    for (int i = pos; i < m - 1; ++i)
      copy_dropping(L + static_cast<int64_t>(i) * mmax, L + static_cast<int64_t>(i + 1) * mmax, i + 1, pos, lane);
  }

  // Borders the corral with candidate k if its pivot exceeds min_pivot2; weight 0. q0: k's products with the
  // first m0 members, when already known, and r0 the first m0 entries of its border L^{-1}(q + 1) (both written
  // by their owner lanes).
  __device__ bool add(int k, double min_pivot2, const double* q0 = nullptr, const double* r0 = nullptr, int m0 = 0) {
    if (m >= mmax) return false;
    __syncwarp();
    for (int s = lane; s < m; s += 32) {  // q_s = <x_{S[s]}, x_k>
      double acc = 0.0;
      if (s < m0) {
        wv[s] = q0[s];
        res[s] = r0[s];
        continue;
      }
      const int ks = S[s];
      for (int c = 0; c < d; ++c) acc += xs(ks, c) * xs(k, c);
      wv[s] = acc;
      res[s] = acc + 1.0;
    }
    double qkk = 0.0;  // this lane's part of <x_k, x_k>, summed over the warp with the border's norm
    for (int c = lane; c < d; c += 32) {
      const double v = xs(k, c);
      qkk += v * v;
    }
    forward_solve(m, res, m0);
    double rr = 0.0;
    for (int s = lane; s < m; s += 32) rr += res[s] * res[s];
    warp_sum2(qkk, rr);
    const double piv2 = qkk + 1.0 + a.ridge - rr;
    if (!(piv2 > min_pivot2)) return false;
    double* lm = L + static_cast<int64_t>(m) * mmax;
    for (int s = lane; s < m; s += 32) {
      lm[s] = res[s];
      Q[static_cast<int64_t>(m) * mmax + s] = wv[s];
      Q[static_cast<int64_t>(s) * mmax + m] = wv[s];
    }
    if (lane == 0) {
      lm[m] = sqrt(piv2);
      Q[static_cast<int64_t>(m) * mmax + m] = qkk;
      lam[m] = 0.0;
      S[m] = k;
      flags[k] |= kInCorral;
    }
    ++m;
    __syncwarp();
    return true;
  }

  // Drops corral member i (factor by rotations; Gram, slots and weights shift down).
  __device__ void remove(int i) {
    cholesky_delete(i);
    for (int r = 0; r < m - 1; ++r) {  // column i dropped; rows below i move up (source rows are never above)
      double* qr = Q + static_cast<int64_t>(r) * mmax;
      if (r < i)
        copy_dropping(qr + i, qr + i, m - 1 - i, 0, lane);
      else
        copy_dropping(qr, qr + mmax, m - 1, i, lane);
    }
    if (lane == 0) flags[S[i]] &= static_cast<uint8_t>(~kInCorral);
    __syncwarp();
    copy_dropping(S, S, m - 1, i, lane);
    copy_dropping(lam, lam, m - 1, i, lane);
    --m;
    __syncwarp();
  }

  // Wolfe's minor cycle: affine minimum-norm weights y of the corral ((Q + 1 1^T + ridge I) z = 1, one
  // refinement against the system without ridge, y = z / sum z); while some y_i <= eps_w, move towards y until
  // the first weight reaches 0 and drop it (and every weight left at 0). Ends at y > 0 on the corral.
  __device__ void minor() {
    for (int step = 0, steps = m + 2; step < steps && m > 0; ++step) {
      __syncwarp();
      for (int i = lane; i < m; i += 32) z[i] = 1.0;
      cholesky_solve(m, z);
      double part = 0.0;
      for (int j = lane; j < m; j += 32) part += z[j];
      const double zsum = warp_sum(part);
      __syncwarp();  // every lane reads all of z
      for (int i = lane; i < m; i += 32) {  // Q is symmetric: column i, read across lanes
        double acc = 0.0;
        for (int j = 0; j < m; ++j) acc += Q[static_cast<int64_t>(j) * mmax + i] * z[j];
        res[i] = 1.0 - zsum - acc;
      }
      cholesky_solve(m, res);
      part = 0.0;
      for (int i = lane; i < m; i += 32) {
        z[i] += res[i];
        part += z[i];
      }
      const double zs = warp_sum(part);
      if (!(isfinite(zs) && zs > 0.0)) return;  // keeps the weights, as the twin
      double best = INFINITY;
      int first = -1;
      for (int i = lane; i < m; i += 32) {
        y[i] = z[i] / zs;
        if (y[i] > a.eps_w) continue;
        const double ratio = lam[i] / max_of(lam[i] - y[i], 1e-300);
        if (ratio < best) {
          best = ratio;
          first = i;
        }
      }
      warp_argmin(best, first);  // the first slot on ties
      if (first < 0) {
        for (int i = lane; i < m; i += 32) lam[i] = y[i];
        __syncwarp();
        return;
      }
      const double theta = min_of(max_of(best, 0.0), 1.0);
      part = 0.0;
      for (int i = lane; i < m; i += 32) {
        const double l = lam[i] + theta * (y[i] - lam[i]);
        const bool drop = (y[i] <= a.eps_w && l <= a.eps_w) || i == first;
        wv[i] = drop ? -1.0 : max_of(l, 0.0);  // -1 marks a dropped point
        if (!drop) part += wv[i];
      }
      const double sum = warp_sum(part);
      for (int i = lane; i < m; i += 32) lam[i] = wv[i] < 0.0 ? -1.0 : (sum > 0.0 ? wv[i] / sum : wv[i]);
      __syncwarp();  // every lane reads each lam[i] below (remove ends in step)
      for (int i = m - 1; i >= 0; --i)  // last first: the positions below stay valid
        if (lam[i] < 0.0) remove(i);
    }
  }

  __device__ void solve(int64_t row) {
    const int64_t n = a.n;
    const double* wi = a.w + a.rows[row] * static_cast<int64_t>(d);
    const int64_t* cand = a.cand + row * static_cast<int64_t>(K);
    __syncwarp();  // the previous row's reads of this scratch are done
    // the candidate star, a lane per candidate, exact differences (a zero one is a duplicated value: no valid
    // direction); a candidate outside [0, n) is padding (on a GPU the indices are not range-checked up front)
    bool dup = false;
    for (int k = lane; k < K; k += 32) {
      const int64_t j = cand[k];
      double* x = X + static_cast<int64_t>(k) * d;
      uint8_t f = 0;
      if (j < 0 || j >= n) {
        for (int c = 0; c < d; ++c) x[c] = 0.0;
      } else {
        const double* wj = a.w + j * d;
        double nn = 0.0;
        for (int c = 0; c < d; ++c) {
          const double t = wi[c] - wj[c];
          x[c] = t;
          nn += t * t;
        }
        const double nrm = sqrt(nn);
        if (nrm > 0.0) {
          const double inv = 1.0 / nrm;
          for (int c = 0; c < d; ++c) x[c] *= inv;
          f = kValid;
        } else {
          dup = true;
        }
      }
      flags[k] = f;
    }
    dup = __any_sync(kFull, dup);
    __syncwarp();
    // the warm corral (positions into cand), bordered point by point; its weights restart the line search
    m = 0;
    double wsum = 0.0;
    for (int64_t t = 0; t < a.kw; ++t) {
      const int64_t kk = a.warm_cols ? a.warm_cols[row * a.kw + t] : -1;
      if (kk < 0 || kk >= K) continue;
      const int k = static_cast<int>(kk);
      if (!(flags[k] & kValid) || (flags[k] & kInCorral)) continue;
      if (add(k, kDependentPivot2)) {
        const double lw = max_of(a.warm_lam[row * a.kw + t], 0.0);
        if (lane == ((m - 1) & 31)) lam[m - 1] = lw;
        wsum += lw;
      }
    }
    if (m > 0) {
      for (int s = lane; s < m; s += 32) lam[s] = wsum > 0.0 ? lam[s] / wsum : 1.0 / static_cast<double>(m);
      minor();
    }
    const double* start = a.start + row * static_cast<int64_t>(d);
    double best_lo = -INFINITY, best_hi = INFINITY, prev_pp = INFINITY;
    {
      double part = 0.0;
      for (int c = lane; c < d; c += 32) part += start[c] * start[c];
      const double sn = sqrt(warp_sum(part));
      for (int c = lane; c < d; c += 32) u[c] = start[c] / max_of(sn, 1e-300);
    }
    for (int64_t it = 0;; ++it) {
      // the point: the corral's hull point, or the start direction before the first addition
      const bool hull = m > 0;
      __syncwarp();  // lam and S were written by their owners
      if (hull) {
        for (int c = lane; c < d; c += 32) {
          double acc = 0.0;
          for (int s = 0; s < m; ++s) acc += lam[s] * xs(S[s], c);
          p[c] = acc;
        }
      } else {
        for (int c = lane; c < d; c += 32) p[c] = start[c];
      }
      __syncwarp();  // every lane reads all of p
      // certificate against every candidate: g_k = <x_k, p>, a lane per candidate
      double gl = INFINITY;
      for (int k = lane; k < K; k += 32) {
        double acc = 0.0;
        for (int c = 0; c < d; ++c) acc += xs(k, c) * p[c];
        g[k] = acc;
        if ((flags[k] & kValid) && acc < gl) gl = acc;
      }
      const double gmin = warp_min(gl);
      double part = 0.0;
      for (int c = lane; c < d; c += 32) part += p[c] * p[c];
      const double pp = warp_sum(part), pn = sqrt(pp);
      double lo = pn > 0.0 ? gmin / pn : -INFINITY;
      if (!isfinite(gmin)) lo = 1.0;  // no other value
      if (lo > best_lo) {
        best_lo = lo;
        if (pn > 0.0)
          for (int c = lane; c < d; c += 32) u[c] = p[c] / pn;
      }
      if (hull) {
        best_hi = min_of(best_hi, pn);
        // certified, at 0, or stalled (a Wolfe major cycle lowers ||p|| unless rounding stops it)
        if (pp - gmin <= a.tol * pp || pp <= a.zero_norm2 || !isfinite(gmin) || pp >= prev_pp * (1.0 - 1e-14)) break;
        prev_pp = pp;
      }
      if (it >= a.max_iter) break;
      // additions: the most violating candidates outside the corral in (g, index) order, the first one without
      // the pivot test; each pick is the warp's smallest (g, k) after the previous pick. They are picked and added
      // in groups: the group's products with the corral as it stands take one pass over the members' rows.
      const int64_t want = hull ? a.n_add : a.n_init;
      const double thr = hull ? pp * (1.0 - 0.5 * a.tol) : INFINITY;
      const int before = m;
      double prev_g = -INFINITY;
      int prev_k = -1;
      bool more = true;
      for (int64_t t = 0; more && t < want && m < mmax;) {
        int pick[kCorralSolveGroup];
        int picked = 0;
#pragma unroll
        for (int v = 0; v < kCorralSolveGroup; ++v) {
          pick[v] = -1;
          if (picked == v && more && t < want) {
            double bv = INFINITY;
            int bk = -1;
            for (int k = lane; k < K; k += 32) {
              const double gk = g[k];
              if (flags[k] != kValid || !(gk < thr)) continue;  // invalid, in the corral, or not violating
              if (gk < prev_g || (gk == prev_g && k <= prev_k)) continue;  // picked already
              if (gk < bv) {  // ascending k within a lane: the lowest index on ties
                bv = gk;
                bk = k;
              }
            }
            warp_argmin(bv, bk);
            if (bk < 0) {
              more = false;
            } else {
              pick[v] = bk;
              prev_g = bv;
              prev_k = bk;
              ++picked;
              ++t;
            }
          }
        }
        if (picked == 0) break;
        const int m0 = m;
        for (int s = lane; s < m0; s += 32) {  // qg[v][s] = <x_{S[s]}, x_{pick[v]}>, a lane per member
          const double* xm = X + static_cast<int64_t>(S[s]) * d;
          double acc[kCorralSolveGroup];
#pragma unroll
          for (int v = 0; v < kCorralSolveGroup; ++v) acc[v] = 0.0;
          for (int c = 0; c < d; ++c) {
            const double xc = xm[c];
#pragma unroll
            for (int v = 0; v < kCorralSolveGroup; ++v)
              if (v < picked) acc[v] += xc * xs(pick[v], c);
          }
#pragma unroll
          for (int v = 0; v < kCorralSolveGroup; ++v)
            if (v < picked) {
              qg[static_cast<int64_t>(v) * mmax + s] = acc[v];
              qs[static_cast<int64_t>(v) * mmax + s] = acc[v] + 1.0;
            }
        }
        forward_solve_group(m0, qs, picked);  // the group's borders against the corral as it stands
#pragma unroll
        for (int v = 0; v < kCorralSolveGroup; ++v)
          if (v < picked && m < mmax)
            add(pick[v], m == before ? 0.0 : kDependentPivot2, qg + static_cast<int64_t>(v) * mmax,
                qs + static_cast<int64_t>(v) * mmax, m0);
      }
      if (m == before) break;  // nothing to add: the point stays (its certificate is what it is)
      if (!hull && lane == 0) lam[0] = 1.0;  // a cold start begins at the most violating point
      minor();
      if (m == 0) break;
    }
    __syncwarp();
    for (int c = lane; c < d; c += 32) a.u[row * d + c] = u[c];
    if (lane == 0) {
      a.lo[row] = best_lo;
      a.hi[row] = best_hi;
      a.dup[row] = dup ? 1 : 0;
    }
    for (int64_t s = lane; s < a.kc; s += 32) {
      a.out_cols[row * a.kc + s] = s < m ? S[s] : -1;
      a.out_lam[row * a.kc + s] = s < m ? lam[s] : 0.0;
    }
  }
};

// The five slot vectors (lam, z, res, y, wv: 5 (d + 1) doubles a warp) sit in shared memory where a block's fit
// without opting in to more: the triangular solves' steps each read what the step before wrote, a round trip to
// L2 from global memory.
constexpr int64_t kSlotVectorBytes = 48 * 1024;
inline int64_t slot_vector_bytes(int64_t d) {
  return kWarpsPerBlock * 5 * (d + 1) * static_cast<int64_t>(sizeof(double));
}

// At most 128 registers a thread (4 blocks of 4 warps a multiprocessor; without the bound nvcc took 168).
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 4)
    corral_solve_kernel(const __grid_constant__ CorralSolveArgs a, int64_t scratch, bool shared_slots) {
  extern __shared__ double slot_smem[];
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (warp >= a.slots) return;  // whole warps
  const int lane = static_cast<int>(threadIdx.x & 31);
  double* work = a.work + kCorralSolveHeader + warp * scratch;
  const int64_t mmax = a.d + 1;
  double* slot_vectors = shared_slots ? slot_smem + (threadIdx.x / 32) * 5 * mmax
                                      : work + a.k * a.d + a.k + 2 * mmax * mmax;  // their place in the slice
  RowSolver s(a, lane, work, slot_vectors);
  unsigned long long* next_row = reinterpret_cast<unsigned long long*>(a.work);
  for (;;) {  // rows differ in their work: each warp takes the next one when it is done
    unsigned long long row = 0;
    if (lane == 0) row = atomicAdd(next_row, 1ull);
    row = __shfl_sync(kFull, row, 0);
    if (row >= static_cast<unsigned long long>(a.r)) break;
    s.solve(static_cast<int64_t>(row));
  }
}

}  // namespace

void corral_solve(const CorralSolveArgs& a, uintptr_t stream) {
  if (a.r <= 0) return;
  if (a.slots <= 0 || a.work == nullptr) throw std::invalid_argument("corral_solve: no workspace");
  const cudaStream_t st = as_stream(stream);
  check(cudaMemsetAsync(a.work, 0, sizeof(unsigned long long), st), "corral_solve (row counter)");
  const bool shared_slots = slot_vector_bytes(a.d) <= kSlotVectorBytes;
  corral_solve_kernel<<<static_cast<unsigned>(ceil_div(a.slots, kWarpsPerBlock)), kWarpsPerBlock * 32,
                        shared_slots ? static_cast<size_t>(slot_vector_bytes(a.d)) : 0, st>>>(
      a, corral_solve_scratch(a.d, a.k), shared_slots);
  check_launch("corral_solve");
}

}  // namespace cuda
}  // namespace factkernels
