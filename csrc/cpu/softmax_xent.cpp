// Row-wise softmax cross-entropy: per row, a max pass, an exp-and-sum pass that writes the
// unnormalized softmax, and a scale pass, all while the row sits in L1. The torch twin makes
// six passes over the whole (n, c) matrix (max, subtract, clamp, exp, sum, divide), each
// through memory once the scores outgrow the cache, as a GD step's (models * F, |V|) do.
#include "cpu/common.h"

namespace factkernels {
namespace cpu {

template <typename T> void softmax_xent(const SoftmaxXentArgs<T>& a) {
  const int64_t n = a.n, c = a.c;
  if (n <= 0 || c <= 0) return;
  constexpr int64_t kRows = 8;  // rows per task
  parallel_tasks(ceil_div(n, kRows), [&](int64_t task, int, auto isa) FK_LAMBDA_INLINE {
    using Isa = decltype(isa);
    using VT = Vec<T, Isa>;
    using M = VecMath<T, Isa>;
    using V = typename VT::type;
    using VI = typename VT::itype;
    constexpr int L = VT::kLanes;
    const T inf = std::numeric_limits<T>::infinity();
    const int64_t full = c - c % L;  // the last c % L entries go through a padded vector
    const int64_t i_end = std::min(n, (task + 1) * kRows);
    for (int64_t i = task * kRows; i < i_end; ++i) {
      const T* s = a.s + i * a.lds;
      T* p = a.prob + i * a.ldp;
      const T own = s[a.target[i]];  // before pass 2, which may overwrite s (prob == s)
      alignas(64) T tail[L];
      for (int l = 0; l < L; ++l) tail[l] = l < c - full ? s[full + l] : -inf;
      // pass 1: the row's max; NaN lanes are collected apart (the vector max would skip them)
      V top_v = VT::load(tail);
      VI nan = top_v != top_v;
      for (int64_t j = 0; j < full; j += L) {
        const V x = VT::load(s + j);
        top_v = M::select(x > top_v, x, top_v);
        nan |= x != x;
      }
      T top = -inf;
      bool any_nan = false;
      for (int l = 0; l < L; ++l) {
        top = top_v[l] > top ? top_v[l] : top;
        any_nan = any_nan || nan[l] != 0;
      }
      if (any_nan) top = std::numeric_limits<T>::quiet_NaN();
      // pass 2: e = exp(max(s - top, -floor)), written to prob, and its sum
      const V top_s = VT::splat(top), floor_s = VT::splat(-a.floor);
      V sum_v{};
      for (int64_t j = 0; j < full; j += L) {
        V d = VT::load(s + j) - top_s;
        d = M::select(d < floor_s, floor_s, d);  // NaN stays NaN
        const V e = M::exp(d);
        VT::store(p + j, e);
        sum_v += e;
      }
      T sum = 0;
      for (int l = 0; l < L; ++l) sum += sum_v[l];
      if (full < c) {
        V d = VT::load(tail) - top_s;
        d = M::select(d < floor_s, floor_s, d);
        const V e = M::exp(d);
        for (int64_t l = 0; l < c - full; ++l) {
          p[full + l] = e[l];
          sum += e[l];
        }
      }
      // pass 3: normalize
      const T inv = T(1) / sum;
      const V inv_s = VT::splat(inv);
      for (int64_t j = 0; j < full; j += L) VT::store(p + j, VT::load(p + j) * inv_s);
      for (int64_t j = full; j < c; ++j) p[j] *= inv;
      a.loss[i] = std::log(sum) + top - own;
      a.hit[i] = own >= top ? 1 : 0;
    }
  }, n * c * 16);
}

template void softmax_xent<float>(const SoftmaxXentArgs<float>&);
template void softmax_xent<double>(const SoftmaxXentArgs<double>&);

}  // namespace cpu
}  // namespace factkernels
