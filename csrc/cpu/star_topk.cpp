// Fused star scores: the k smallest (<p_i, w_s - w_j> / |w_s - w_j|) of every row over all
// values j, streaming over w in packed tiles with O(r k) state, never the r x n scores.
// One tile of P W^T and one of W_s W^T (the same packed panel) give numerators and
// distances; the rare close pairs are recomputed from their explicit difference.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu/common.h"

namespace factkernels {
namespace cpu {
namespace {

// Relative squared distance below which the Gram identity cancels too much.
template <typename T> constexpr T kCloseRel = sizeof(T) == 8 ? T(1e-6) : T(1e-3);

// A (score, j) candidate of a row's list; lists rank by score, then by the lower j. In float, one integer key: the
// score's bits made monotone (the sign flips the rest) above j's 32 bits, so selections and sorts compare integers
// (the pass at k = 192 spent a third of its time in them with a two-field comparison).
template <typename T> struct PickCodec;
template <> struct PickCodec<float> {
  using Key = uint64_t;
  static FK_INLINE Key encode(float x, int64_t j) {
    uint32_t u;
    x += 0.0f;  // -0 ranks as +0
    std::memcpy(&u, &x, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t(u) << 32) | uint64_t(uint32_t(j));
  }
  static FK_INLINE float score(Key key) {
    uint32_t u = uint32_t(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  }
  static FK_INLINE int64_t index(Key key) { return int64_t(key & 0xffffffffu); }
  static FK_INLINE bool before(Key a, Key b) { return a < b; }
};
template <> struct PickCodec<double> {
  struct Key {
    double v;
    int64_t j;
  };
  static FK_INLINE Key encode(double x, int64_t j) { return Key{x, j}; }
  static FK_INLINE double score(const Key& key) { return key.v; }
  static FK_INLINE int64_t index(const Key& key) { return key.j; }
  static FK_INLINE bool before(const Key& a, const Key& b) { return a.v < b.v || (a.v == b.v && a.j < b.j); }
};
template <typename T> using Pick = typename PickCodec<T>::Key;

// Reorders keys[0, n) so that keys[0, k) are the k smallest (all distinct: j differs) and keys[k - 1] the k-th: a
// quickselect whose partition moves every key without a branch on the comparison (std::nth_element's branches
// mispredicted on half the keys: 0.23 of a pass's cycles at k = 192, 4,096 x 4,096, d = 128).
template <typename T> void select_smallest(Pick<T>* keys, int64_t n, int64_t k) {
  using C = PickCodec<T>;
  int64_t lo = 0, hi = n;
  const int64_t target = k - 1;  // keys[target] is the k-th once [lo, hi) is down to it
  while (hi - lo > 4) {
    // the median of the first, middle and last key as the pivot, kept at hi - 1
    Pick<T>& a = keys[lo];
    Pick<T>& b = keys[lo + (hi - lo) / 2];
    Pick<T>& c = keys[hi - 1];
    if (C::before(b, a)) std::swap(a, b);
    if (C::before(c, b)) std::swap(b, c);
    if (C::before(b, a)) std::swap(a, b);
    std::swap(b, c);
    const Pick<T> pivot = keys[hi - 1];
    int64_t i = lo;  // keys[lo, i) rank before the pivot, keys[i, j) after it
    for (int64_t j = lo; j < hi - 1; ++j) {
      const Pick<T> x = keys[j];
      const bool lower = C::before(x, pivot);
      keys[j] = keys[i];
      keys[i] = x;
      i += lower;
    }
    keys[hi - 1] = keys[i];
    keys[i] = pivot;
    if (i == target) return;
    if (i < target) {
      lo = i + 1;
    } else {
      hi = i;
    }
  }
  for (int64_t i = lo + 1; i < hi; ++i)  // insertion sort of the last few (branches: as few as can be)
    for (int64_t j = i; j > lo && C::before(keys[j], keys[j - 1]); --j) std::swap(keys[j], keys[j - 1]);
}

// A row's running k smallest (score, j) pairs: a candidate ranking before the threshold is appended to a buffer
// of 2k, and a full buffer keeps its k smallest (select_smallest), the k-th of them becoming the threshold. Amortized
// O(1) per candidate: a max-heap's sift-down (log k unpredictable branches per entry) took 0.2 of 0.33 CPU s of a
// pass at k = 192 (4,096 x 4,096, d = 128).
template <typename T> struct Picks {
  using C = PickCodec<T>;
  Pick<T>* buf = nullptr;  // 2k entries
  int64_t k = 0, count = 0;
  T thr = std::numeric_limits<T>::infinity();
  int64_t thr_j = std::numeric_limits<int64_t>::max();

  void reset(Pick<T>* storage, int64_t k_) {
    buf = storage;
    k = k_;
    count = 0;
    thr = std::numeric_limits<T>::infinity();
    thr_j = std::numeric_limits<int64_t>::max();
  }
  // Whether (x, j) ranks before the threshold (before the first reduction, every pair does).
  FK_INLINE bool admits(T x, int64_t j) const { return x < thr || (x == thr && j < thr_j); }
  FK_INLINE void push(T x, int64_t j) {
    buf[count++] = C::encode(x, j);
    if (count == 2 * k) keep_smallest();
  }
  void keep_smallest() {
    select_smallest<T>(buf, count, k);
    count = k;
    thr = C::score(buf[k - 1]);
    thr_j = C::index(buf[k - 1]);
  }
  // The k smallest ascending into v, ix (+inf and -1 past the pairs seen).
  void write(T* v, int64_t* ix) {
    if (count > k) keep_smallest();
    std::sort(buf, buf + count, [](const Pick<T>& x, const Pick<T>& y) { return C::before(x, y); });  // inlined
    for (int64_t t = 0; t < k; ++t) {
      v[t] = t < count ? C::score(buf[t]) : std::numeric_limits<T>::infinity();
      ix[t] = t < count ? C::index(buf[t]) : int64_t(-1);
    }
  }
};

// Bit l set where lane l of the comparison mask m is set (x86: one movemask).
template <class Isa, typename T> FK_INLINE uint32_t lane_bits(const typename Vec<T, Isa>::itype& m) {
#ifdef FK_X86_DISPATCH
  typedef float f4 __attribute__((vector_size(16)));
  typedef double d2 __attribute__((vector_size(16)));
  typedef float f8 __attribute__((vector_size(32)));
  typedef double d4 __attribute__((vector_size(32)));
  if constexpr (Isa::kVecBytes == 32 && sizeof(T) == 4) return uint32_t(__builtin_ia32_movmskps256((f8)m));
  if constexpr (Isa::kVecBytes == 32 && sizeof(T) == 8) return uint32_t(__builtin_ia32_movmskpd256((d4)m));
  if constexpr (Isa::kVecBytes == 16 && sizeof(T) == 4) return uint32_t(__builtin_ia32_movmskps((f4)m));
  if constexpr (Isa::kVecBytes == 16 && sizeof(T) == 8) return uint32_t(__builtin_ia32_movmskpd((d2)m));
#endif
  uint32_t bits = 0;
  for (int l = 0; l < Vec<T, Isa>::kLanes; ++l) bits |= uint32_t(m[l] != 0) << l;
  return bits;
}

// Bit jj (jj < cols <= kNR) set where the score sc[jj] ranks before thr or is NaN (a pair for the exact path): the
// row's candidates among one panel's scores, by vector compares (a branch per score mispredicted on most of the
// candidates, ~1,000 of a row's 4,096 scores at k = 192).
template <class Isa, typename T> FK_INLINE uint32_t candidates(Isa, const T* sc, T thr, int64_t cols) {
  using VT = Vec<T, Isa>;
  constexpr int L = VT::kLanes, NR = kNR<T>;
  uint32_t bits = 0;
  for (int v = 0; v < NR / L; ++v) {
    const auto x = VT::load(sc + v * L);
    bits |= lane_bits<Isa, T>((x < thr) | (x != x)) << (v * L);
  }
  return cols < NR ? bits & ((uint32_t(1) << cols) - 1) : bits;
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

// Bytes of the per-thread lists the symmetric pass may hold (beyond them it streams every pair twice).
constexpr int64_t kSymmetricListBytes = int64_t(256) << 20;
// Longest lists the symmetric pass keeps: it halves the products, but a column's list takes candidates from
// every block above it. At 4,096 x 128 (one thread) it took 0.046 / 0.083 / 0.126 / 0.169 CPU s at k = 2 / 16 /
// 32 / 64, the pass by rows 0.078 / 0.105 / 0.122 / 0.155 (at k = 192 0.31 against 0.24).
constexpr int64_t kSymmetricMaxK = 24;

// Whether every value scores its own star (p = w, rows 0..n-1 in order): the symmetric pass applies.
template <typename T> bool symmetric_case(const StarTopkArgs<T>& a) {
  if (a.p != nullptr || a.r != a.n || a.n <= 16 * kNR<T> || a.k > kSymmetricMaxK) return false;
  if (int64_t(num_threads()) * a.n * 2 * a.k * int64_t(sizeof(Pick<T>)) > kSymmetricListBytes) return false;
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
  // per thread: the lists of the rows of its current block, then those of every row as a column
  const Buffer<Pick<T>> row_store = alloc_buffer<Pick<T>>(threads * B * 2 * k);
  const Buffer<Pick<T>> col_store = alloc_buffer<Pick<T>>(threads * n * 2 * k);
  std::vector<Picks<T>> col_picks(size_t(threads) * n);
  for (int th = 0; th < threads; ++th)
    for (int64_t j = 0; j < n; ++j) col_picks[size_t(th) * n + j].reset(col_store.get() + (th * n + j) * 2 * k, k);
  const Buffer<T> scratch = alloc_buffer<T>(threads * B * std::max<int64_t>(d, 1));
  const T close = kCloseRel<T>;
  parallel_tasks(nb, [&](int64_t I, int tid, auto isa) FK_LAMBDA_INLINE {
    T* vp = scratch.get() + tid * B * d;
    Picks<T>* cols_of = col_picks.data() + size_t(tid) * n;
    alignas(64) T c1[kMR * NR];  // <w_i, w_j>
    alignas(64) T sc[NR];
    alignas(64) T dist[NR];
    const int64_t i_begin = I * B, i_end = std::min(n, i_begin + B);
    Picks<T> rows_of[B];
    for (int64_t q = 0; q < B; ++q) rows_of[q].reset(row_store.get() + (tid * B + q) * 2 * k, k);
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
            Picks<T>& pk = rows_of[i - i_begin];
            T thr = pk.thr;  // j grows along the row: a tie with the threshold never enters
            for (uint32_t bits = candidates(isa, sc, thr, cols); bits != 0; bits &= bits - 1) {
              const int64_t jj = __builtin_ctz(bits);
              T x = sc[jj];
              if (x >= thr) continue;
              const int64_t j = j0 + jj;
              if (x != x) {
                if (j == i) continue;
                x = exact_score(isa, wr[ii], wr[ii], a.w + j * a.ldw, d);
                if (!(x < thr)) continue;
              }
              pk.push(x, j);
              thr = pk.thr;
            }
            if (J == I) continue;  // the diagonal block scores both orders as rows
            // rows j of block J, column i: <w_j, w_i> and sq_j + sq_i as their own rows would compute them
            for (int64_t jj = 0; jj < cols; ++jj) sc[jj] = (sqj[jj] - g[jj]) / dist[jj];
            for (int64_t jj = 0; jj < cols; ++jj) {
              Picks<T>& cj = cols_of[j0 + jj];
              T x = sc[jj];
              if (x >= cj.thr && x == x) continue;  // (a tie with the threshold ranks by j below)
              if (x != x) {
                const T* wj = a.w + (j0 + jj) * a.ldw;
                x = exact_score(isa, wj, wj, wr[ii], d);
              }
              if (cj.admits(x, i)) cj.push(x, i);
            }
          }
        }
      }
    }
    for (int64_t i = i_begin; i < i_end; ++i) rows_of[i - i_begin].write(a.vals + i * k, a.idx + i * k);
  }, n * n * d / 2);
  // each row's list takes the pairs the threads collected for it as a column: the k smallest of all
  parallel_tasks(ceil_div(n, B), [&](int64_t t, int tid, auto) FK_LAMBDA_INLINE {
    Picks<T> pk;
    for (int64_t i = t * B, end = std::min(n, (t + 1) * B); i < end; ++i) {
      pk.reset(row_store.get() + tid * B * 2 * k, k);
      T* v = a.vals + i * k;
      int64_t* ix = a.idx + i * k;
      for (int64_t e = 0; e < k && ix[e] >= 0; ++e) pk.push(v[e], ix[e]);
      for (int th = 0; th < threads; ++th) {
        const Picks<T>& c = col_picks[size_t(th) * n + i];
        for (int64_t e = 0; e < c.count; ++e) {
          const T x = PickCodec<T>::score(c.buf[e]);
          const int64_t j = PickCodec<T>::index(c.buf[e]);
          if (pk.admits(x, j)) pk.push(x, j);
        }
      }
      pk.write(v, ix);
    }
  }, n * k * threads * 8);
}

}  // namespace

template <typename T> void star_topk(const StarTopkArgs<T>& a) {
  const int64_t r = a.r, n = a.n, d = a.d, k = a.k;
  if (r <= 0 || k <= 0) return;
  if (n > int64_t(0xffffffff)) throw std::invalid_argument("star_topk takes fewer than 2^32 values (a list's j)");
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
  auto lists = [&](int64_t ch, int64_t i, T*& v, int64_t*& ix) {
    v = ch == 0 ? a.vals + i * k : extra_v.data() + ((ch - 1) * r + i) * k;
    ix = ch == 0 ? a.idx + i * k : extra_i.data() + ((ch - 1) * r + i) * k;
  };

  // the values packed once for every task (n x d, a copy of w's size): packed by each task, tile by tile, they
  // were 0.11 of the first pass's cycles (k = 192, 4,096 x 4,096, d = 128)
  const Panels<T> packed = pack_panels(a.w, a.ldw, 1, n, d);
  const Buffer<Pick<T>> pick_store = alloc_buffer<Pick<T>>(num_threads() * kRowBlock * 2 * k);
  const T close = kCloseRel<T>;
  parallel_tasks(nrb * nchunks, [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    const int64_t rb = t / nchunks, ch = t % nchunks;
    Picks<T> picks[kRowBlock];  // the task's rows, in order
    for (int64_t q = 0; q < kRowBlock; ++q) picks[q].reset(pick_store.get() + (tid * kRowBlock + q) * 2 * k, k);
    alignas(64) T c1[kMR * NR];  // <p_i, w_j>
    alignas(64) T c2[kMR * NR];  // <w_s, w_j>
    alignas(64) T sc[NR];
    const int64_t i_begin = rb * kRowBlock, i_end = std::min(r, i_begin + kRowBlock);
    const int64_t tile_end = std::min(ntiles, (ch + 1) * tiles_per_chunk);
    for (int64_t tile = ch * tiles_per_chunk; tile < tile_end; ++tile) {
      const int64_t v0 = tile * kVTile, nvt = std::min(kVTile, n - v0), np = ceil_div(nvt, NR);
      const T* vp = packed.panel(v0 / NR);
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
            Picks<T>& pk = picks[i - i_begin];
            T thr = pk.thr;  // j grows within a task, so a tie with the threshold never enters
            for (uint32_t bits = candidates(isa, sc, thr, cols); bits != 0; bits &= bits - 1) {
              const int64_t jj = __builtin_ctz(bits);
              T x = sc[jj];
              if (x >= thr) continue;  // the threshold fell since
              const int64_t j = j0 + jj;
              if (x != x) {
                if (j == s) continue;
                x = exact_score(isa, pr[ii], wr[ii], a.w + j * a.ldw, d);
                if (!(x < thr)) continue;
              }
              pk.push(x, j);
              thr = pk.thr;
            }
          }
        }
      }
    }
    for (int64_t i = i_begin; i < i_end; ++i) {
      T* v;
      int64_t* ix;
      lists(ch, i, v, ix);
      picks[i - i_begin].write(v, ix);
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
