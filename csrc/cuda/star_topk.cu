// Fused star scores: block (x, z) owns 32 rows and one range of the values (split z
// of `splits`), streamed in 64-value tiles. Two tile products (<p_i, w_j> and
// <w_s, w_j>) give the numerators and the distances; the scores of a tile go
// through shared memory to one thread per row, which keeps that row's ascending
// k-list (most scores fail its threshold test). With one split the lists are the
// output; with several (few rows: too few row blocks to fill the GPU) each range
// keeps its own lists and a second kernel merges them in range order, earlier
// ranges winning ties, so the result equals one pass. O(splits r k) memory, no r x n scores.
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

// The k-list of row i for value range z: the output itself with one range, else that range's part.
template <typename T> __device__ __forceinline__ T* row_vals(const StarTopkArgs<T>& a, int64_t z, int64_t i) {
  return gridDim.y == 1 ? a.vals + i * a.k : a.part_vals + (z * a.r + i) * a.k;
}
template <typename T> __device__ __forceinline__ int64_t* row_idx(const StarTopkArgs<T>& a, int64_t z, int64_t i) {
  return gridDim.y == 1 ? a.idx + i * a.k : a.part_idx + (z * a.r + i) * a.k;
}

template <typename T>
__global__ void __launch_bounds__(SS::kThreads) star_topk_kernel(StarTopkArgs<T> a, int64_t cols_per_split) {
  __shared__ TileSmem<T, SS> sm;
  __shared__ T sc[SS::BM][SS::BN + 1];
  __shared__ T pw[SS::BM];
  __shared__ T sqself[SS::BM];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * SS::BM;
  const int64_t z = blockIdx.y, c_begin = z * cols_per_split;
  const int64_t c_end = c_begin + cols_per_split < a.n ? c_begin + cols_per_split : a.n;
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
    sqself[threadIdx.x] = a.sq[s];
    T* v = row_vals(a, z, i);
    int64_t* ix = row_idx(a, z, i);
    for (int64_t q = 0; q < a.k; ++q) {
      v[q] = kInf;
      ix[q] = -1;
    }
  }
  __syncthreads();

  for (int64_t col0 = c_begin; col0 < c_end; col0 += SS::BN) {
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
        if (r < a.r && c < c_end) {
          const T sqs = sqself[rr], sqj = a.sq[c];
          const T d2 = sqs + sqj - T(2) * gram[i][j];
          v = d2 > close_rel<T>() * (sqs + sqj) ? (pw[rr] - num[i][j]) / sqrt(d2) : kNaN;
        }
        sc[rr][cc] = v;
      }
    }
    __syncthreads();
    if (threadIdx.x < SS::BM && row0 + threadIdx.x < a.r) {
      const int64_t i = row0 + threadIdx.x, s = a.self[i];
      T* v = row_vals(a, z, i);
      int64_t* ix = row_idx(a, z, i);
      T thr = v[a.k - 1];
      const int64_t cols = min(static_cast<int64_t>(SS::BN), c_end - col0);
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

// One thread per row: merges the ranges' ascending lists in range order into the output (a later range's
// entry goes first only when strictly smaller: the lowest j wins ties, as in one pass). Range 0's part is
// the running merge; each step writes the merged list to the output row and copies it back.
template <typename T> __global__ void star_topk_merge_kernel(StarTopkArgs<T> a, int64_t splits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.r) return;
  T* acc_v = a.part_vals + i * a.k;
  int64_t* acc_i = a.part_idx + i * a.k;
  T* out_v = a.vals + i * a.k;
  int64_t* out_i = a.idx + i * a.k;
  for (int64_t z = 1; z < splits; ++z) {
    const T* bv = a.part_vals + (z * a.r + i) * a.k;
    const int64_t* bi = a.part_idx + (z * a.r + i) * a.k;
    int64_t x = 0, y = 0;
    for (int64_t o = 0; o < a.k; ++o) {
      if (bv[y] < acc_v[x]) {
        out_v[o] = bv[y];
        out_i[o] = bi[y++];
      } else {
        out_v[o] = acc_v[x];
        out_i[o] = acc_i[x++];
      }
    }
    for (int64_t o = 0; o < a.k; ++o) {
      acc_v[o] = out_v[o];
      acc_i[o] = out_i[o];
    }
  }
}

}  // namespace

template <typename T> void star_topk(const StarTopkArgs<T>& a, uintptr_t stream) {
  if (a.r <= 0 || a.k <= 0) return;
  const int64_t row_blocks = ceil_div(a.r, SS::BM);
  if (row_blocks > 0x7fffffffLL) throw std::invalid_argument("star_topk: too many rows");
  // Ranges of whole 64-value tiles; every range is non-empty, so splits <= the requested a.splits.
  const int64_t want = (a.part_vals && a.part_idx) ? std::clamp<int64_t>(a.splits, 1, 65535) : 1;
  const int64_t cols_per_split = ceil_div(ceil_div(std::max<int64_t>(a.n, 1), SS::BN), want) * SS::BN;
  const int64_t splits = std::max<int64_t>(1, ceil_div(a.n, cols_per_split));
  const cudaStream_t st = as_stream(stream);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  star_topk_kernel<T><<<grid, SS::kThreads, 0, st>>>(a, cols_per_split);
  check_launch("star_topk");
  if (splits > 1) {
    star_topk_merge_kernel<T><<<static_cast<unsigned>(ceil_div(a.r, 256)), 256, 0, st>>>(a, splits);
    check_launch("star_topk (merge)");
  }
}

template void star_topk<float>(const StarTopkArgs<float>&, uintptr_t);
template void star_topk<double>(const StarTopkArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
