// Fused star scores: the k smallest (<p_i, w_s - w_j> / |w_s - w_j|) of every row over all
// values j, streaming over w in packed tiles with O(r k) state, never the r x n scores.
// One tile of P W^T and one of W_s W^T (the same packed panel) give numerators and
// distances; the rare close pairs are recomputed from their explicit difference.
#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu/common.h"

namespace factkernels {
namespace cpu {
namespace {

// Relative squared distance below which the Gram identity cancels too much.
template <typename T> constexpr T kCloseRel = sizeof(T) == 8 ? T(1e-6) : T(1e-3);

// Each row's running list is a max-heap of (score, j) pairs (the root is the k-th smallest so far; on equal
// scores the larger j ranks higher, so it leaves first): a new pair costs O(log k) instead of shifting up to k
// entries of a sorted list, which took over half of a pass at k = 192 (4,096 x 4,096, d = 128).
template <typename T> FK_INLINE bool heap_above(T s1, int64_t j1, T s2, int64_t j2) {
  return s1 > s2 || (s1 == s2 && j1 > j2);
}

// Replaces the root of the heap v[0, k) by (s, j) (precondition: (s, j) ranks below the root) and sifts it down.
template <typename T> FK_INLINE void heap_replace_top(T* v, int64_t* ix, int64_t k, T s, int64_t j) {
  int64_t pos = 0;
  for (;;) {
    const int64_t l = 2 * pos + 1;
    if (l >= k) break;
    int64_t c = l;
    if (l + 1 < k && heap_above(v[l + 1], ix[l + 1], v[l], ix[l])) c = l + 1;
    if (!heap_above(v[c], ix[c], s, j)) break;
    v[pos] = v[c];
    ix[pos] = ix[c];
    pos = c;
  }
  v[pos] = s;
  ix[pos] = j;
}

// The heap v[0, k) as an ascending list (lowest j first on equal scores), in place; o: k scratch pairs.
template <typename T> void heap_to_sorted(T* v, int64_t* ix, int64_t k, std::vector<std::pair<T, int64_t>>& o) {
  o.resize(k);
  for (int64_t t = 0; t < k; ++t) o[t] = {v[t], ix[t]};
  std::sort(o.begin(), o.end(),
            [](const auto& a, const auto& b) { return heap_above(b.first, b.second, a.first, a.second); });
  for (int64_t t = 0; t < k; ++t) {
    v[t] = o[t].first;
    ix[t] = o[t].second;
  }
}

// <p, ws - wj> / |ws - wj| from the explicit difference; 0 for identical values.
template <class Isa, typename T> FK_INLINE T exact_score(Isa, const T* p, const T* ws, const T* wj, int64_t d) {
  using VT = Vec<T, Isa>;
  constexpr int L = VT::kLanes;
  typename VT::type nv{}, pv{};
  int64_t c = 0;
  for (; c + L <= d; c += L) {
    const auto df = VT::load(ws + c) - VT::load(wj + c);
    nv += df * df;
    pv += VT::load(p + c) * df;
  }
  T nn = 0, num = 0;
  for (int l = 0; l < L; ++l) {
    nn += nv[l];
    num += pv[l];
  }
  for (; c < d; ++c) {
    const T df = ws[c] - wj[c];
    nn += df * df;
    num += p[c] * df;
  }
  return nn > 0 ? num / std::sqrt(nn) : T(0);
}

// Merges the ascending list (bv, bi) of a later range of j into (av, ai) (earlier wins ties).
template <typename T> void merge(T* av, int64_t* ai, const T* bv, const int64_t* bi, int64_t k, T* tv, int64_t* ti) {
  int64_t x = 0, y = 0;
  for (int64_t o = 0; o < k; ++o) {
    if (bv[y] < av[x]) {
      tv[o] = bv[y];
      ti[o] = bi[y++];
    } else {
      tv[o] = av[x];
      ti[o] = ai[x++];
    }
  }
  std::copy(tv, tv + k, av);
  std::copy(ti, ti + k, ai);
}

// Whether (s, j) enters a heap whose root is (root_s, root_j) (the k smallest pairs in (score, j) order).
template <typename T> FK_INLINE bool ranks_below(T s, int64_t j, T root_s, int64_t root_j) {
  return s < root_s || (s == root_s && j < root_j);
}

// Bytes of the per-thread lists the symmetric pass may hold (beyond them it streams every pair twice).
constexpr int64_t kSymmetricListBytes = int64_t(256) << 20;

// Whether every value scores its own star (p = w, rows 0..n-1 in order): the symmetric pass applies.
template <typename T> bool symmetric_case(const StarTopkArgs<T>& a) {
  if (a.p != nullptr || a.r != a.n || a.n <= 16 * kNR<T>) return false;
  if (int64_t(num_threads()) * a.n * a.k * int64_t(sizeof(T) + sizeof(int64_t)) > kSymmetricListBytes) return false;
  for (int64_t i = 0; i < a.n; ++i)
    if (a.self[i] != i) return false;
  return true;
}

// star_topk of every value against all the others with p_i = w_i, each pair's Gram entry computed once: row
// block I streams tiles J >= I; <w_i, w_j> gives row i its score (sq_i - g) / |w_i - w_j| and, for J > I, row j
// its score (sq_j - g) / |w_j - w_i|, the same bits the two-sided pass computes (the dot product's terms and
// sq_i + sq_j commute), into that thread's own lists, merged in (score, j) order at the end: the same lists.
template <typename T> void star_topk_symmetric(const StarTopkArgs<T>& a) {
  const int64_t n = a.n, d = a.d, k = a.k;
  constexpr int NR = kNR<T>;
  constexpr int64_t B = 16 * NR;  // values per block: the rows of a task and the values of a packed tile
  const int64_t nb = ceil_div(n, B);
  const int threads = num_threads();
  const T inf = std::numeric_limits<T>::infinity();
  std::fill(a.vals, a.vals + n * k, inf);
  std::fill(a.idx, a.idx + n * k, int64_t(-1));
  std::vector<T> col_v(size_t(threads) * n * k, inf);  // per thread: the scores rows got as columns
  std::vector<int64_t> col_i(size_t(threads) * n * k, -1);
  const Buffer<T> scratch = alloc_buffer<T>(threads * B * std::max<int64_t>(d, 1));
  const T close = kCloseRel<T>;
  parallel_tasks(nb, [&](int64_t I, int tid, auto isa) FK_LAMBDA_INLINE {
    T* vp = scratch.get() + tid * B * d;
    T* cv = col_v.data() + size_t(tid) * n * k;
    int64_t* ci = col_i.data() + size_t(tid) * n * k;
    alignas(64) T c1[kMR * NR];  // <w_i, w_j>
    alignas(64) T sc[NR];
    alignas(64) T dist[NR];
    const int64_t i_begin = I * B, i_end = std::min(n, i_begin + B);
    for (int64_t J = I; J < nb; ++J) {
      const int64_t v0 = J * B, nvt = std::min(B, n - v0), np = ceil_div(nvt, NR);
      for (int64_t q = 0; q < np; ++q)
        pack_panel(a.w + (v0 + q * NR) * a.ldw, a.ldw, 1, std::min<int64_t>(NR, nvt - q * NR), d, vp + q * NR * d);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
        const T* wr[kMR];
        for (int ii = 0; ii < kMR; ++ii) wr[ii] = a.w + (i0 + std::min<int64_t>(ii, rows - 1)) * a.ldw;
        for (int64_t q = 0; q < np; ++q) {
          const int64_t j0 = v0 + q * NR, cols = std::min<int64_t>(NR, n - j0);
          micro_kernel(isa, d, wr, vp + q * NR * d, c1, NR, cols);
          const T* sqj = a.sq + j0;
          for (int64_t ii = 0; ii < rows; ++ii) {
            const int64_t i = i0 + ii;
            const T sqs = a.sq[i];
            const T* g = c1 + ii * NR;
            // |w_i - w_j| once for both orders, NaN where the exact path takes over (close pairs, i itself)
            for (int64_t jj = 0; jj < cols; ++jj) {
              const T d2 = sqs + sqj[jj] - T(2) * g[jj];
              dist[jj] = std::sqrt(d2);
            }
            for (int64_t jj = 0; jj < cols; ++jj) {
              const T d2 = sqs + sqj[jj] - T(2) * g[jj];
              dist[jj] = d2 > close * (sqs + sqj[jj]) ? dist[jj] : std::numeric_limits<T>::quiet_NaN();
            }
            // row i, as the two-sided pass scores it
            for (int64_t jj = 0; jj < cols; ++jj) sc[jj] = (sqs - g[jj]) / dist[jj];
            T* v = a.vals + i * k;
            int64_t* ix = a.idx + i * k;
            T thr = v[0];  // j grows along the row: a tie with the root never enters
            for (int64_t jj = 0; jj < cols; ++jj) {
              T x = sc[jj];
              if (x >= thr) continue;
              const int64_t j = j0 + jj;
              if (x != x) {
                if (j == i) continue;
                x = exact_score(isa, wr[ii], wr[ii], a.w + j * a.ldw, d);
                if (!(x < thr)) continue;
              }
              heap_replace_top(v, ix, k, x, j);
              thr = v[0];
            }
            if (J == I) continue;  // the diagonal block scores both orders as rows
            // rows j of block J, column i: <w_j, w_i> and sq_j + sq_i as their own rows would compute them
            for (int64_t jj = 0; jj < cols; ++jj) sc[jj] = (sqj[jj] - g[jj]) / dist[jj];
            for (int64_t jj = 0; jj < cols; ++jj) {
              const int64_t j = j0 + jj;
              T* vj = cv + j * k;
              int64_t* ij = ci + j * k;
              T x = sc[jj];
              if (x != x) {
                const T* wj = a.w + j * a.ldw;
                x = exact_score(isa, wj, wj, wr[ii], d);
              }
              if (ranks_below(x, i, vj[0], ij[0])) heap_replace_top(vj, ij, k, x, i);
            }
          }
        }
      }
    }
  }, n * n * d / 2);
  // each row's own heap takes the pairs the threads collected for it, then sorts
  parallel_tasks(ceil_div(n, B), [&](int64_t t, int, auto) FK_LAMBDA_INLINE {
    std::vector<std::pair<T, int64_t>> pairs;
    for (int64_t i = t * B, end = std::min(n, (t + 1) * B); i < end; ++i) {
      T* v = a.vals + i * k;
      int64_t* ix = a.idx + i * k;
      for (int th = 0; th < threads; ++th)
        for (int64_t e = 0; e < k; ++e) {
          const size_t at = (size_t(th) * n + i) * k + e;
          if (col_i[at] >= 0 && ranks_below(col_v[at], col_i[at], v[0], ix[0]))
            heap_replace_top(v, ix, k, col_v[at], col_i[at]);
        }
      heap_to_sorted(v, ix, k, pairs);
    }
  }, n * k * threads * 8);
}

}  // namespace

template <typename T> void star_topk(const StarTopkArgs<T>& a) {
  const int64_t r = a.r, n = a.n, d = a.d, k = a.k;
  if (r <= 0 || k <= 0) return;
  if (symmetric_case(a)) {
    star_topk_symmetric(a);
    return;
  }
  constexpr int NR = kNR<T>;
  constexpr int64_t kVTile = 16 * NR;  // values packed per tile: kVTile x d stays in L2
  const int64_t nrb = ceil_div(r, kRowBlock);
  const int64_t ntiles = std::max<int64_t>(1, ceil_div(n, kVTile));
  // With few row blocks the values are split into chunks as well, merged in j order after.
  const int64_t want = std::max<int64_t>(1, ceil_div(2 * num_threads(), nrb));
  const int64_t tiles_per_chunk = ceil_div(ntiles, std::min(ntiles, want));
  const int64_t nchunks = ceil_div(ntiles, tiles_per_chunk);

  // Chunk 0 writes the outputs in place; later chunks keep their own lists.
  std::vector<T> extra_v((nchunks - 1) * r * k, std::numeric_limits<T>::infinity());
  std::vector<int64_t> extra_i((nchunks - 1) * r * k, -1);
  std::fill(a.vals, a.vals + r * k, std::numeric_limits<T>::infinity());
  std::fill(a.idx, a.idx + r * k, int64_t(-1));
  auto lists = [&](int64_t ch, int64_t i, T*& v, int64_t*& ix) {
    v = ch == 0 ? a.vals + i * k : extra_v.data() + ((ch - 1) * r + i) * k;
    ix = ch == 0 ? a.idx + i * k : extra_i.data() + ((ch - 1) * r + i) * k;
  };

  const Buffer<T> scratch = alloc_buffer<T>(num_threads() * kVTile * std::max<int64_t>(d, 1));
  const T close = kCloseRel<T>;
  parallel_tasks(nrb * nchunks, [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    const int64_t rb = t / nchunks, ch = t % nchunks;
    T* vp = scratch.get() + tid * kVTile * d;
    alignas(64) T c1[kMR * NR];  // <p_i, w_j>
    alignas(64) T c2[kMR * NR];  // <w_s, w_j>
    alignas(64) T sc[NR];
    const int64_t i_begin = rb * kRowBlock, i_end = std::min(r, i_begin + kRowBlock);
    const int64_t tile_end = std::min(ntiles, (ch + 1) * tiles_per_chunk);
    for (int64_t tile = ch * tiles_per_chunk; tile < tile_end; ++tile) {
      const int64_t v0 = tile * kVTile, nvt = std::min(kVTile, n - v0), np = ceil_div(nvt, NR);
      for (int64_t q = 0; q < np; ++q)
        pack_panel(a.w + (v0 + q * NR) * a.ldw, a.ldw, 1, std::min<int64_t>(NR, nvt - q * NR), d, vp + q * NR * d);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
        const T* wr[kMR];
        const T* pr[kMR];
        T pw[kMR];
        for (int ii = 0; ii < kMR; ++ii) {
          const int64_t i = i0 + std::min<int64_t>(ii, rows - 1);
          wr[ii] = a.w + a.self[i] * a.ldw;
          pr[ii] = a.p ? a.p + i * a.ldp : wr[ii];
          pw[ii] = a.p ? dot(isa, pr[ii], wr[ii], d) : a.sq[a.self[i]];
        }
        for (int64_t q = 0; q < np; ++q) {
          const int64_t j0 = v0 + q * NR, cols = std::min<int64_t>(NR, n - j0);
          micro_kernel(isa, d, pr, vp + q * NR * d, c1, NR, cols);
          if (a.p) micro_kernel(isa, d, wr, vp + q * NR * d, c2, NR, cols);
          const T* g = a.p ? c2 : c1;
          for (int64_t ii = 0; ii < rows; ++ii) {
            const int64_t i = i0 + ii, s = a.self[i];
            const T sqs = a.sq[s];
            // NaN marks pairs for the exact path (close pairs, the value itself). Two straight loops: the
            // division and square root run for every pair, then a select, so both vectorize (a division under
            // a condition could trap and is not if-converted)
            const T* sqj = a.sq + j0;
            for (int64_t jj = 0; jj < cols; ++jj) {
              const T d2 = sqs + sqj[jj] - T(2) * g[ii * NR + jj];
              sc[jj] = (pw[ii] - c1[ii * NR + jj]) / std::sqrt(d2);  // d2 <= 0 gets the exact path below
            }
            for (int64_t jj = 0; jj < cols; ++jj) {
              const T d2 = sqs + sqj[jj] - T(2) * g[ii * NR + jj];
              sc[jj] = d2 > close * (sqs + sqj[jj]) ? sc[jj] : std::numeric_limits<T>::quiet_NaN();
            }
            T* v;
            int64_t* ix;
            lists(ch, i, v, ix);
            T thr = v[0];  // the heap's root: j grows within a task, so a tie with it never enters
            for (int64_t jj = 0; jj < cols; ++jj) {
              T x = sc[jj];
              if (x >= thr) continue;  // most scores stop here
              const int64_t j = j0 + jj;
              if (x != x) {
                if (j == s) continue;
                x = exact_score(isa, pr[ii], wr[ii], a.w + j * a.ldw, d);
                if (!(x < thr)) continue;
              }
              heap_replace_top(v, ix, k, x, j);
              thr = v[0];
            }
          }
        }
      }
    }
    std::vector<std::pair<T, int64_t>> pairs;
    for (int64_t i = i_begin; i < i_end; ++i) {
      T* v;
      int64_t* ix;
      lists(ch, i, v, ix);
      heap_to_sorted(v, ix, k, pairs);
    }
  }, r * n * d * (a.p ? 2 : 1));

  if (nchunks > 1) {
    std::vector<T> tv(k);
    std::vector<int64_t> ti(k);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t ch = 1; ch < nchunks; ++ch) {
        T* v;
        int64_t* ix;
        lists(ch, i, v, ix);
        merge(a.vals + i * k, a.idx + i * k, v, ix, k, tv.data(), ti.data());
      }
  }
}

template <typename T> void star_scores(const StarScoresArgs<T>& a) {
  const int64_t r = a.r, c = a.c, d = a.d, n = a.n;
  if (r <= 0 || c <= 0) return;
  // indices are range-checked here, where they are read (the caller reads nothing back from the device)
  for (int64_t i = 0; i < r; ++i)
    if (a.self[i] < 0 || a.self[i] >= n) throw std::invalid_argument("rows entries must lie in [0, n)");
  for (int64_t q = 0; q < r * c; ++q)
    if (a.cols[q] < -1 || a.cols[q] >= n) throw std::invalid_argument("cols entries must lie in [-1, n)");
  parallel_tasks(ceil_div(r, 64), [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
    for (int64_t i = t * 64, end = std::min(r, (t + 1) * 64); i < end; ++i) {
      const T* ws = a.w + a.self[i] * a.ldw;
      const T* u = a.u + i * a.ldu;
      const int64_t* cols = a.cols + i * c;
      for (int64_t q = 0; q < c; ++q) {
        if (q + 2 < c && cols[q + 2] >= 0)  // scattered rows: fetch two ahead
          for (int64_t x = 0; x < d; x += 64 / static_cast<int64_t>(sizeof(T)))
            __builtin_prefetch(a.w + cols[q + 2] * a.ldw + x);
        const int64_t j = cols[q];
        a.out[i * c + q] = j < 0 ? std::numeric_limits<T>::infinity() : exact_score(isa, u, ws, a.w + j * a.ldw, d);
      }
    }
  }, r * c * d * 4);
}

template void star_topk<float>(const StarTopkArgs<float>&);
template void star_topk<double>(const StarTopkArgs<double>&);
template void star_scores<float>(const StarScoresArgs<float>&);
template void star_scores<double>(const StarScoresArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
