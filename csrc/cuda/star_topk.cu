// Fused star scores: each block owns 32 rows and streams over all values in
// 64-value tiles. Two tile products (<p_i, w_j> and <w_s, w_j>) give the
// numerators and the distances; the scores of a tile go through shared memory
// to one thread per row, which keeps that row's ascending k-list in the output
// (most scores fail its threshold test). O(r k) memory, no r x n scores.
#include <cuda/std/limits>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using SS = TileShape<32, 64, 16, 2, 4>;  // 256 threads

// Row r of the product operand is the value w[self[r]].
template <typename T> struct SelfRows {
  const T* w;
  int64_t ldw;
  const int64_t* self;
  __device__ __forceinline__ T operator()(int64_t r, int64_t k) const { return w[self[r] * ldw + k]; }
};

template <typename T> __device__ __forceinline__ T close_rel() { return sizeof(T) == 8 ? T(1e-6) : T(1e-3); }

template <typename T> __global__ void __launch_bounds__(SS::kThreads) star_topk_kernel(StarTopkArgs<T> a) {
  __shared__ TileSmem<T, SS> sm;
  __shared__ T sc[SS::BM][SS::BN + 1];
  __shared__ T pw[SS::BM];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * SS::BM;
  const int tx = threadIdx.x % SS::kThreadsX, ty = threadIdx.x / SS::kThreadsX;
  constexpr T kInf = ::cuda::std::numeric_limits<T>::infinity();
  const T kNaN = ::cuda::std::numeric_limits<T>::quiet_NaN();
  const SelfRows<T> ws{a.w, a.ldw, a.self};

  if (threadIdx.x < SS::BM && row0 + threadIdx.x < a.r) {
    const int64_t i = row0 + threadIdx.x, s = a.self[i];
    T acc = T(0);
    if (a.p) {
      for (int64_t c = 0; c < a.d; ++c) acc += a.p[i * a.ldp + c] * a.w[s * a.ldw + c];
    } else {
      acc = a.sq[s];
    }
    pw[threadIdx.x] = acc;
    for (int64_t q = 0; q < a.k; ++q) {
      a.vals[i * a.k + q] = kInf;
      a.idx[i * a.k + q] = -1;
    }
  }
  __syncthreads();

  for (int64_t col0 = 0; col0 < a.n; col0 += SS::BN) {
    T num[SS::TM][SS::TN], gram[SS::TM][SS::TN];
    if (a.p) {
      tile_product<SS, true, true>(sm, RowMajor<T>{a.p, a.ldp}, row0, a.r, RowMajor<T>{a.w, a.ldw}, col0, a.n, a.d,
                                   num);
      tile_product<SS, true, true>(sm, ws, row0, a.r, RowMajor<T>{a.w, a.ldw}, col0, a.n, a.d, gram);
    } else {
      tile_product<SS, true, true>(sm, ws, row0, a.r, RowMajor<T>{a.w, a.ldw}, col0, a.n, a.d, gram);
#pragma unroll
      for (int i = 0; i < SS::TM; ++i)
#pragma unroll
        for (int j = 0; j < SS::TN; ++j) num[i][j] = gram[i][j];
    }
#pragma unroll
    for (int i = 0; i < SS::TM; ++i) {
      const int rr = ty + i * SS::kThreadsY;
      const int64_t r = row0 + rr;
#pragma unroll
      for (int j = 0; j < SS::TN; ++j) {
        const int cc = tx + j * SS::kThreadsX;
        const int64_t c = col0 + cc;
        T v = kInf;
        if (r < a.r && c < a.n) {
          const T sqs = a.sq[a.self[r]], sqj = a.sq[c];
          const T d2 = sqs + sqj - T(2) * gram[i][j];
          v = d2 > close_rel<T>() * (sqs + sqj) ? (pw[rr] - num[i][j]) / sqrt(d2) : kNaN;
        }
        sc[rr][cc] = v;
      }
    }
    __syncthreads();
    if (threadIdx.x < SS::BM && row0 + threadIdx.x < a.r) {
      const int64_t i = row0 + threadIdx.x, s = a.self[i];
      T* v = a.vals + i * a.k;
      int64_t* ix = a.idx + i * a.k;
      T thr = v[a.k - 1];
      const int64_t cols = min(static_cast<int64_t>(SS::BN), a.n - col0);
      for (int cc = 0; cc < cols; ++cc) {
        T x = sc[threadIdx.x][cc];
        if (x >= thr) continue;
        const int64_t j = col0 + cc;
        if (x != x) {  // close pair or the value itself: explicit difference
          if (j == s) continue;
          T nn = 0, nm = 0;
          for (int64_t c = 0; c < a.d; ++c) {
            const T df = a.w[s * a.ldw + c] - a.w[j * a.ldw + c];
            nn += df * df;
            nm += (a.p ? a.p[i * a.ldp + c] : a.w[s * a.ldw + c]) * df;
          }
          x = nn > T(0) ? nm / sqrt(nn) : T(0);
          if (!(x < thr)) continue;
        }
        int64_t pos = a.k - 1;
        while (pos > 0 && x < v[pos - 1]) {
          v[pos] = v[pos - 1];
          ix[pos] = ix[pos - 1];
          --pos;
        }
        v[pos] = x;
        ix[pos] = j;
        thr = v[a.k - 1];
      }
    }
    __syncthreads();
  }
}

}  // namespace

template <typename T> void star_topk(const StarTopkArgs<T>& a, uintptr_t stream) {
  if (a.r <= 0 || a.k <= 0) return;
  star_topk_kernel<T><<<static_cast<unsigned>(ceil_div(a.r, SS::BM)), SS::kThreads, 0, as_stream(stream)>>>(a);
  check_launch("star_topk");
}

template void star_topk<float>(const StarTopkArgs<float>&, uintptr_t);
template void star_topk<double>(const StarTopkArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
