// Fused decode: argmax_j <y_i, v_j> and its margin, streaming over v in
// packed tiles with O(n) state, never forming the n x nv score matrix.
#include <vector>

#include "cpu/common.h"

namespace factkernels {
namespace cpu {
namespace {

// Running state of one row over a contiguous range of v, scanned in order.
template <typename T> struct Best {
  int64_t idx = 0;
  T top1 = -std::numeric_limits<T>::infinity();  // best score (lowest index on ties)
  T top2 = -std::numeric_limits<T>::infinity();  // best score over j != idx
  T target = std::numeric_limits<T>::quiet_NaN();
};

// a ranks above b: NaN ranks above every number (as in torch.argmax).
template <typename T> FK_INLINE bool beats(T a, T b) { return a > b || (a != a && b == b); }

template <typename T> FK_INLINE void scan(Best<T>& b, const T* s, int64_t cols, int64_t j0, int64_t target) {
  for (int64_t jj = 0; jj < cols; ++jj) {
    const T v = s[jj];
    if (!(v <= b.top2)) {  // v > top2 or a NaN: rare once warmed up, most scores fail this one test
      if (beats(v, b.top1)) {
        b.top2 = b.top1;
        b.top1 = v;
        b.idx = j0 + jj;
      } else if (beats(v, b.top2)) {
        b.top2 = v;
      }
    }
  }
  if (target >= j0 && target < j0 + cols) b.target = s[target - j0];
}

// Folds the state of a later range of v into b (earlier range wins ties).
template <typename T> void merge(Best<T>& b, const Best<T>& o) {
  if (beats(o.top1, b.top1)) {
    b.top2 = beats(b.top1, o.top2) ? b.top1 : o.top2;
    b.top1 = o.top1;
    b.idx = o.idx;
  } else {
    b.top2 = beats(b.top2, o.top1) ? b.top2 : o.top1;
  }
}

}  // namespace

template <typename T> void decode(const DecodeArgs<T>& a) {
  const int64_t n = a.n, nv = a.nv, d = a.d;
  if (n <= 0 || nv <= 0) return;
  constexpr int NR = kNR<T>;
  constexpr int64_t kVTile = 16 * NR;  // values packed per tile: kVTile x d stays in L2
  const int64_t nrb = ceil_div(n, kRowBlock);
  const int64_t ntiles = ceil_div(nv, kVTile);
  // With few row blocks (small n) v is split into chunks as well, merged in v order after.
  const int64_t want = std::max<int64_t>(1, ceil_div(2 * num_threads(), nrb));
  const int64_t tiles_per_chunk = ceil_div(ntiles, std::min(ntiles, want));
  const int64_t nchunks = ceil_div(ntiles, tiles_per_chunk);

  std::vector<Best<T>> state(nchunks * n);
  const Buffer<T> scratch = alloc_buffer<T>(num_threads() * kVTile * d);
  parallel_tasks(nrb * nchunks, [&](int64_t t, int tid, auto isa) FK_LAMBDA_INLINE {
    const int64_t rb = t / nchunks, ch = t % nchunks;
    T* vp = scratch.get() + tid * kVTile * d;
    Best<T>* st = state.data() + ch * n;
    alignas(64) T c[kMR * NR];
    const int64_t i_begin = rb * kRowBlock, i_end = std::min(n, i_begin + kRowBlock);
    const int64_t tile_end = std::min(ntiles, (ch + 1) * tiles_per_chunk);
    for (int64_t tile = ch * tiles_per_chunk; tile < tile_end; ++tile) {
      const int64_t v0 = tile * kVTile, nvt = std::min(kVTile, nv - v0), np = ceil_div(nvt, NR);
      for (int64_t p = 0; p < np; ++p)
        pack_panel(a.v + (v0 + p * NR) * a.ldv, a.ldv, 1, std::min<int64_t>(NR, nvt - p * NR), d, vp + p * NR * d);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
        const T* yr[kMR];
        row_ptrs(a.y + i0 * a.ldy, a.ldy, rows, yr);
        for (int64_t p = 0; p < np; ++p) {
          const int64_t j0 = v0 + p * NR, cols = std::min<int64_t>(NR, nv - j0);
          micro_kernel(isa, d, yr, vp + p * NR * d, c, NR, cols);
          for (int64_t ii = 0; ii < rows; ++ii)
            scan(st[i0 + ii], c + ii * NR, cols, j0, a.target ? a.target[i0 + ii] : -1);
        }
      }
    }
  }, n * nv * d);

  for (int64_t i = 0; i < n; ++i) {
    Best<T> b = state[i];
    for (int64_t ch = 1; ch < nchunks; ++ch) merge(b, state[ch * n + i]);
    a.index[i] = b.idx;
    if (a.target) {
      const int64_t tg = a.target[i];
      const int64_t ch = std::clamp<int64_t>(tg / kVTile / tiles_per_chunk, 0, nchunks - 1);
      a.margin[i] = state[ch * n + i].target - (tg == b.idx ? b.top2 : b.top1);
    } else {
      a.margin[i] = b.top1 - b.top2;
    }
  }
}

template void decode<float>(const DecodeArgs<float>&);
template void decode<double>(const DecodeArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
