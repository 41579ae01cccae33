// Fused max-over-heads scores: each block owns one (batch, 32 query rows x 32
// keys) tile and runs the tiled product once per head, folding it into a
// running max in registers; scores and/or the threshold decision are stored
// once. The (batch, h, lq, lk) per-head scores never reach global memory.
#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using MS = TileShape<32, 32, 16, 2, 2>;  // 16 x 16 threads: small tiles suit short contexts (ell ~ 16)

template <typename T>
__global__ void __launch_bounds__(MS::kThreads) max_head_scores_kernel(MaxHeadScoresArgs<T> a, int64_t row_tiles) {
  __shared__ TileSmem<T, MS> sm;
  const int64_t b = blockIdx.x / row_tiles;
  const int64_t row0 = (blockIdx.x % row_tiles) * MS::BM, col0 = static_cast<int64_t>(blockIdx.y) * MS::BN;
  T best[MS::TM][MS::TN];
  for (int64_t head = 0; head < a.h; ++head) {
    const int64_t bh = b * a.h + head;
    T acc[MS::TM][MS::TN];
    tile_product<MS, true, true>(sm, RowMajor<T>{a.q + bh * a.lq * a.dk, a.dk}, row0, a.lq,
                                 RowMajor<T>{a.k + bh * a.lk * a.dk, a.dk}, col0, a.lk, a.dk, acc);
#pragma unroll
    for (int i = 0; i < MS::TM; ++i)
#pragma unroll
      for (int j = 0; j < MS::TN; ++j) {
        const T v = acc[i][j];
        if (head == 0 || v > best[i][j] || v != v) best[i][j] = v;  // a NaN wins, as in torch's amax
      }
  }
  const int tx = threadIdx.x % MS::kThreadsX, ty = threadIdx.x / MS::kThreadsX;
  const T tau = a.tau ? a.tau[b] : T(0);
#pragma unroll
  for (int i = 0; i < MS::TM; ++i) {
    const int64_t r = row0 + ty + i * MS::kThreadsY;
#pragma unroll
    for (int j = 0; j < MS::TN; ++j) {
      const int64_t c = col0 + tx + j * MS::kThreadsX;
      if (r >= a.lq || c >= a.lk) continue;
      const int64_t o = (b * a.lq + r) * a.lk + c;
      if (a.scores) a.scores[o] = best[i][j];
      if (a.decision) a.decision[o] = best[i][j] > tau;
    }
  }
}

}  // namespace

template <typename T> void max_head_scores(const MaxHeadScoresArgs<T>& a, uintptr_t stream) {
  if (a.batch <= 0 || a.lq <= 0 || a.lk <= 0) return;
  const int64_t row_tiles = ceil_div(a.lq, MS::BM), col_tiles = ceil_div(a.lk, MS::BN);
  if (a.batch * row_tiles > 0x7fffffff || col_tiles > 65535)
    throw std::invalid_argument("max_head_scores: too many tiles (batch * ceil(lq / 32) or ceil(lk / 32))");
  const dim3 grid(static_cast<unsigned>(a.batch * row_tiles), static_cast<unsigned>(col_tiles));
  max_head_scores_kernel<T><<<grid, MS::kThreads, 0, as_stream(stream)>>>(a, row_tiles);
  check_launch("max_head_scores");
}

template void max_head_scores<float>(const MaxHeadScoresArgs<float>&, uintptr_t);
template void max_head_scores<double>(const MaxHeadScoresArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
