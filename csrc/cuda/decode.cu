// Fused decode: each block owns 32 rows of y and streams over all of v in
// 64-value tiles. Every thread keeps, for its rows, the best / second-best
// score and index over the columns it computed; the 16 threads sharing a row
// (one half-warp) then merge with shuffles. O(n) memory, no n x nv scores.
#include <cuda/std/limits>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using DS = TileShape<32, 64, 16, 2, 4>;  // 16 x 16 threads; row-mates are a half-warp
static_assert(DS::kThreadsX == 16, "row reduction assumes 16 threads per row");

template <typename T> __global__ void __launch_bounds__(DS::kThreads) decode_kernel(DecodeArgs<T> a) {
  __shared__ TileSmem<T, DS> sm;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * DS::BM;
  const int tx = threadIdx.x % DS::kThreadsX, ty = threadIdx.x / DS::kThreadsX;
  constexpr T kNegInf = -::cuda::std::numeric_limits<T>::infinity();

  T top1[DS::TM], top2[DS::TM], tval[DS::TM];
  int64_t idx[DS::TM], tgt[DS::TM];
  bool found[DS::TM];
#pragma unroll
  for (int i = 0; i < DS::TM; ++i) {
    const int64_t r = row0 + ty + i * DS::kThreadsY;
    top1[i] = top2[i] = kNegInf;
    tval[i] = T(0);
    idx[i] = ::cuda::std::numeric_limits<int64_t>::max();  // loses every tie until a real column is seen
    tgt[i] = (a.target && r < a.n) ? a.target[r] : -1;
    found[i] = false;
  }

  for (int64_t col0 = 0; col0 < a.nv; col0 += DS::BN) {
    T acc[DS::TM][DS::TN];
    tile_product<DS, true, true>(sm, RowMajor<T>{a.y, a.ldy}, row0, a.n, RowMajor<T>{a.v, a.ldv}, col0, a.nv, a.d,
                                 acc);
#pragma unroll
    for (int i = 0; i < DS::TM; ++i)
#pragma unroll
      for (int j = 0; j < DS::TN; ++j) {  // a thread's columns ascend with j and col0: '>' keeps the lowest
        const int64_t c = col0 + tx + j * DS::kThreadsX;
        if (c >= a.nv) continue;
        const T s = acc[i][j];
        if (s > top2[i]) {
          if (s > top1[i]) {
            top2[i] = top1[i];
            top1[i] = s;
            idx[i] = c;
          } else {
            top2[i] = s;
          }
        }
        if (c == tgt[i]) {
          tval[i] = s;
          found[i] = true;
        }
      }
  }

#pragma unroll
  for (int i = 0; i < DS::TM; ++i) {
    // Butterfly over the half-warp; the merge is symmetric, so all 16 lanes agree.
#pragma unroll
    for (int off = DS::kThreadsX / 2; off > 0; off /= 2) {
      const T o1 = __shfl_xor_sync(0xffffffffu, top1[i], off);
      const T o2 = __shfl_xor_sync(0xffffffffu, top2[i], off);
      const long long oi = __shfl_xor_sync(0xffffffffu, static_cast<long long>(idx[i]), off);
      const T ov = __shfl_xor_sync(0xffffffffu, tval[i], off);
      const bool of = __shfl_xor_sync(0xffffffffu, static_cast<int>(found[i]), off) != 0;
      if (o1 > top1[i] || (o1 == top1[i] && oi < idx[i])) {
        top2[i] = top1[i] > o2 ? top1[i] : o2;
        top1[i] = o1;
        idx[i] = oi;
      } else {
        top2[i] = top2[i] > o1 ? top2[i] : o1;
      }
      if (of) {
        tval[i] = ov;
        found[i] = true;
      }
    }
    const int64_t r = row0 + ty + i * DS::kThreadsY;
    if (tx == 0 && r < a.n) {
      const int64_t best = idx[i] == ::cuda::std::numeric_limits<int64_t>::max() ? 0 : idx[i];
      a.index[r] = best;
      if (a.target) {
        const T ts = found[i] ? tval[i] : ::cuda::std::numeric_limits<T>::quiet_NaN();
        a.margin[r] = ts - (tgt[i] == best ? top2[i] : top1[i]);
      } else {
        a.margin[r] = top1[i] - top2[i];
      }
    }
  }
}

}  // namespace

template <typename T> void decode(const DecodeArgs<T>& a, uintptr_t stream) {
  if (a.n <= 0 || a.nv <= 0) return;
  decode_kernel<T><<<static_cast<unsigned>(ceil_div(a.n, DS::BM)), DS::kThreads, 0, as_stream(stream)>>>(a);
  check_launch("decode");
}

template void decode<float>(const DecodeArgs<float>&, uintptr_t);
template void decode<double>(const DecodeArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
