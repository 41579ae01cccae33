// Shared CUDA building blocks: error checks, device queries and the shared-memory
// tiled product A B^T that the Hadamard Gram, the head scores and the star scores
// accumulate through, with row-major operand loaders.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace factkernels {
namespace cuda {

inline cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so later calls are not blamed for this one
    throw std::runtime_error(std::string("factkernels CUDA ") + what + ": " + cudaGetErrorString(err));
  }
}
inline void check_launch(const char* what) { check(cudaGetLastError(), what); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Multiprocessors of the current device (launch sizing).
int multiprocessor_count();

// ----------------------------------------------------------- tiled product

// A block computes BM x BN outputs over BK-wide slices of the reduction; each
// thread owns TM x TN of them, strided (row ty + i * kThreadsY, column
// tx + j * kThreadsX) so shared-memory reads and global stores are contiguous
// across a warp.
template <int BM_, int BN_, int BK_, int TM_, int TN_> struct TileShape {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kThreadsX = BN / TN, kThreadsY = BM / TM, kThreads = kThreadsX * kThreadsY;
};
// 256 threads, 4 x 4 outputs each. A 128 x 128 float32 tile with 8 x 8 per thread (twice the FMAs per shared
// load) was built and raced on an H100 (benchmarks/results/gpu_suite-NVIDIA_H100_80GB_HBM3-tile128.json): every
// product launched through it ran 1.3-2.6x slower than with this tile, so it was removed (benchmarks/runs/gpu/NOTES.md).
using Tile64 = TileShape<64, 64, 16, 4, 4>;

// Reduction-major slices; the +1 column breaks bank conflicts on the transposing stores.
template <typename T, class S> struct TileSmem {
  T a[S::BK][S::BM + 1];
  T b[S::BK][S::BN + 1];
};

// Operand loader: element (r, k) of a product operand, reduction index k.
template <typename T> struct RowMajor {  // ptr[r * ld + k]
  const T* ptr;
  int64_t ld;
  __device__ __forceinline__ T operator()(int64_t r, int64_t k) const { return ptr[r * ld + k]; }
};

// dst[kk * (R + 1) + r] = load(r0 + r, k0 + kk), zero outside [0, rows) x [0, K).
// KContig: the operand is contiguous along k, so consecutive threads take
// consecutive k (coalesced); otherwise consecutive threads take consecutive rows.
template <int R, int BK, int kThreads, bool KContig, typename T, class Load>
__device__ __forceinline__ void load_slice(T* dst, const Load& load, int64_t r0, int64_t rows, int64_t k0,
                                           int64_t K) {
  for (int e = threadIdx.x; e < R * BK; e += kThreads) {
    const int r = KContig ? e / BK : e % R;
    const int kk = KContig ? e % BK : e / R;
    const int64_t gr = r0 + r, gk = k0 + kk;
    dst[kk * (R + 1) + r] = (gr < rows && gk < K) ? load(gr, gk) : T(0);
  }
}

// acc[i][j] = sum_{k_begin <= k < K} A(row0 + ty + i * kThreadsY, k) * B(col0 + tx + j * kThreadsX, k).
// Ends with a barrier, so the caller may reuse the shared memory.
template <class S, bool AKContig, bool BKContig, typename T, class LoadA, class LoadB>
__device__ __forceinline__ void tile_product(TileSmem<T, S>& sm, const LoadA& la, int64_t row0, int64_t rows,
                                             const LoadB& lb, int64_t col0, int64_t cols, int64_t K,
                                             T (&acc)[S::TM][S::TN], int64_t k_begin = 0) {
  const int tx = threadIdx.x % S::kThreadsX, ty = threadIdx.x / S::kThreadsX;
#pragma unroll
  for (int i = 0; i < S::TM; ++i)
#pragma unroll
    for (int j = 0; j < S::TN; ++j) acc[i][j] = T(0);
  for (int64_t k0 = k_begin; k0 < K; k0 += S::BK) {
    load_slice<S::BM, S::BK, S::kThreads, AKContig>(&sm.a[0][0], la, row0, rows, k0, K);
    load_slice<S::BN, S::BK, S::kThreads, BKContig>(&sm.b[0][0], lb, col0, cols, k0, K);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < S::BK; ++kk) {
      T av[S::TM], bv[S::TN];
#pragma unroll
      for (int i = 0; i < S::TM; ++i) av[i] = sm.a[kk][ty + i * S::kThreadsY];
#pragma unroll
      for (int j = 0; j < S::TN; ++j) bv[j] = sm.b[kk][tx + j * S::kThreadsX];
#pragma unroll
      for (int i = 0; i < S::TM; ++i)
#pragma unroll
        for (int j = 0; j < S::TN; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
}

}  // namespace cuda
}  // namespace factkernels
