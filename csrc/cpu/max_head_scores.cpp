// Fused max-over-heads scores: for each tile of query rows x packed key panel,
// the per-head products are computed one head after another and folded into a
// running max, then stored with the threshold decision. The (batch, h, lq, lk)
// score tensor a head-by-head torch implementation materializes never exists.
#include "cpu/common.h"

namespace factkernels {
namespace cpu {
namespace {

// best = max(best, c) elementwise over count entries (a multiple of the vector
// width); a NaN in c wins, as in torch's amax.
template <class Isa, typename T> FK_INLINE void fold_max(Isa, T* best, const T* c, int64_t count) {
  using VT = Vec<T, Isa>;
  using M = VecMath<T, Isa>;
  constexpr int L = VT::kLanes;
  for (int64_t e = 0; e < count; e += L) {
    const auto b = VT::load(best + e), v = VT::load(c + e);
    VT::store(best + e, M::select((v > b) | (v != v), v, b));
  }
}

}  // namespace

template <typename T> void max_head_scores(const MaxHeadScoresArgs<T>& a) {
  if (a.batch <= 0 || a.lq <= 0 || a.lk <= 0) return;
  constexpr int NR = kNR<T>;
  const int64_t np = ceil_div(a.lk, NR), panel_size = NR * a.dk;
  // Every (batch, head) key block packed once: about the size of k itself.
  const Buffer<T> packed = alloc_buffer<T>(a.batch * a.h * np * panel_size);
  parallel_tasks(a.batch * a.h * np, [&](int64_t t, int, auto) FK_LAMBDA_INLINE {
    const int64_t bh = t / np, p = t % np;
    pack_panel(a.k + (bh * a.lk + p * NR) * a.dk, a.dk, 1, std::min<int64_t>(NR, a.lk - p * NR), a.dk,
               packed.get() + t * panel_size);
  }, a.batch * a.h * a.lk * a.dk);

  const int64_t nrb = ceil_div(a.lq, kRowBlock);
  parallel_tasks(a.batch * nrb, [&](int64_t t, int, auto isa) FK_LAMBDA_INLINE {
    const int64_t b = t / nrb, i_begin = (t % nrb) * kRowBlock, i_end = std::min(a.lq, i_begin + kRowBlock);
    const T tau = a.tau ? a.tau[b] : T(0);
    alignas(64) T best[kMR * NR] = {};
    alignas(64) T c[kMR * NR] = {};
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
      const int64_t rows = std::min<int64_t>(kMR, i_end - i0);
      for (int64_t p = 0; p < np; ++p) {
        const int64_t cols = std::min<int64_t>(NR, a.lk - p * NR);
        for (int64_t head = 0; head < a.h; ++head) {
          const int64_t bh = b * a.h + head;
          const T* qr[kMR];
          row_ptrs(a.q + (bh * a.lq + i0) * a.dk, a.dk, rows, qr);
          micro_kernel(isa, a.dk, qr, packed.get() + (bh * np + p) * panel_size, head == 0 ? best : c, NR, cols);
          if (head > 0) fold_max(isa, best, c, kMR * NR);
        }
        const int64_t out0 = (b * a.lq + i0) * a.lk + p * NR;
        for (int64_t ii = 0; ii < rows; ++ii) {
          const T* s = best + ii * NR;
          if (a.scores) std::memcpy(a.scores + out0 + ii * a.lk, s, cols * sizeof(T));
          if (a.decision) {
            uint8_t* d = a.decision + out0 + ii * a.lk;
            for (int64_t jj = 0; jj < cols; ++jj) d[jj] = s[jj] > tau;
          }
        }
      }
    }
  }, a.batch * a.h * a.lq * a.lk * a.dk);
}

template void max_head_scores<float>(const MaxHeadScoresArgs<float>&);
template void max_head_scores<double>(const MaxHeadScoresArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
