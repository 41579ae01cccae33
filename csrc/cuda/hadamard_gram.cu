// out = (s s^T) o (p p^T): one block per 64 x 64 tile on or below the
// diagonal, both Gram tiles accumulated in registers, the product staged in
// shared memory so the tile and its mirror are both written coalesced.
#include <cmath>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using S = Tile64;

template <typename T> union GramSmem {
  TileSmem<T, S> tiles;
  T c[S::BM][S::BN + 1];
};

template <typename T> __global__ void __launch_bounds__(S::kThreads) hadamard_gram_kernel(HadamardGramArgs<T> a) {
  static_assert(S::BM == S::BN, "square tiles");
  __shared__ GramSmem<T> sm;
  // blockIdx.x enumerates tile pairs (ti, tj) with tj <= ti, row by row.
  const int64_t b = blockIdx.x;
  int64_t ti = static_cast<int64_t>((sqrt(8.0 * static_cast<double>(b) + 1.0) - 1.0) / 2.0);
  while (ti * (ti + 1) / 2 > b) --ti;
  while ((ti + 1) * (ti + 2) / 2 <= b) ++ti;
  const int64_t tj = b - ti * (ti + 1) / 2;
  const int64_t row0 = ti * S::BM, col0 = tj * S::BN, n = a.n;

  T gs[S::TM][S::TN], gp[S::TM][S::TN];
  tile_product<S, true, true>(sm.tiles, RowMajor<T>{a.s, a.lds}, row0, n, RowMajor<T>{a.s, a.lds}, col0, n, a.h, gs);
  tile_product<S, true, true>(sm.tiles, RowMajor<T>{a.p, a.ldp}, row0, n, RowMajor<T>{a.p, a.ldp}, col0, n, a.q, gp);

  const int tx = threadIdx.x % S::kThreadsX, ty = threadIdx.x / S::kThreadsX;
#pragma unroll
  for (int i = 0; i < S::TM; ++i)
#pragma unroll
    for (int j = 0; j < S::TN; ++j) sm.c[ty + i * S::kThreadsY][tx + j * S::kThreadsX] = gs[i][j] * gp[i][j];
  __syncthreads();

  for (int e = threadIdx.x; e < S::BM * S::BN; e += S::kThreads) {
    const int il = e / S::BN, jl = e % S::BN;  // (i, j), j <= i: consecutive threads along j
    const int64_t i = row0 + il, j = col0 + jl;
    if (i < n && j <= i) a.out[i * a.ldo + j] = sm.c[il][jl];
  }
  if (a.lower_only) return;
  for (int e = threadIdx.x; e < S::BM * S::BN; e += S::kThreads) {
    const int jl = e / S::BM, il = e % S::BM;  // mirror (j, i), j < i: consecutive threads along i
    const int64_t i = row0 + il, j = col0 + jl;
    if (i < n && j < i) a.out[j * a.ldo + i] = sm.c[il][jl];
  }
}

}  // namespace

template <typename T> void hadamard_gram(const HadamardGramArgs<T>& a, uintptr_t stream) {
  if (a.n <= 0) return;
  const int64_t tiles = ceil_div(a.n, S::BM);
  const int64_t blocks = tiles * (tiles + 1) / 2;
  if (blocks > 0x7fffffff) throw std::invalid_argument("hadamard_gram: n too large");
  hadamard_gram_kernel<T><<<static_cast<unsigned>(blocks), S::kThreads, 0, as_stream(stream)>>>(a);
  check_launch("hadamard_gram");
}

template void hadamard_gram<float>(const HadamardGramArgs<float>&, uintptr_t);
template void hadamard_gram<double>(const HadamardGramArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
