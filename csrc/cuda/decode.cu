// Fused decode: block (x, z) owns 32 rows of y and one range of v (split z of
// `splits`), streamed in 64-value tiles. Every thread keeps, for its rows, the
// best / second-best score and index over the columns it computed; the 16
// threads sharing a row (one half-warp) then merge with shuffles. With one
// split the block writes the result; with several (small n: too few row blocks
// to fill the GPU) each writes its range's state and a second kernel merges the
// ranges in order. O(splits * n) memory, never the n x nv scores.
#include <cuda/std/limits>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using DS = TileShape<32, 64, 16, 2, 4>;  // 16 x 16 threads; row-mates are a half-warp
static_assert(DS::kThreadsX == 16, "row reduction assumes 16 threads per row");

constexpr int64_t kNoIndex = ::cuda::std::numeric_limits<int64_t>::max();  // loses every tie

// a ranks above b: NaN ranks above every number (as in torch.argmax).
template <typename T> __device__ __forceinline__ bool beats(T a, T b) { return a > b || (a != a && b == b); }

// Folds state (o1, o2, oi) into (t1, t2, ti): the higher top-1 wins, the lower index on ties.
template <typename T> __device__ __forceinline__ void merge(T& t1, T& t2, int64_t& ti, T o1, T o2, int64_t oi) {
  if (beats(o1, t1) || (!beats(t1, o1) && oi < ti)) {
    t2 = beats(t1, o2) ? t1 : o2;
    t1 = o1;
    ti = oi;
  } else {
    t2 = beats(t2, o1) ? t2 : o1;
  }
}

template <typename T>
__device__ __forceinline__ void finish(const DecodeArgs<T>& a, int64_t r, T top1, T top2, int64_t idx, T tval) {
  const int64_t best = idx == kNoIndex ? 0 : idx;
  a.index[r] = best;
  a.margin[r] = a.target ? tval - (a.target[r] == best ? top2 : top1) : top1 - top2;
}

template <typename T>
__global__ void __launch_bounds__(DS::kThreads) decode_kernel(DecodeArgs<T> a, int64_t cols_per_split) {
  __shared__ TileSmem<T, DS> sm;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * DS::BM;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * cols_per_split;
  const int64_t c_end = c_begin + cols_per_split < a.nv ? c_begin + cols_per_split : a.nv;
  const int tx = threadIdx.x % DS::kThreadsX, ty = threadIdx.x / DS::kThreadsX;
  constexpr T kNegInf = -::cuda::std::numeric_limits<T>::infinity();
  constexpr T kNaN = ::cuda::std::numeric_limits<T>::quiet_NaN();

  T top1[DS::TM], top2[DS::TM], tval[DS::TM];
  int64_t idx[DS::TM], tgt[DS::TM];
#pragma unroll
  for (int i = 0; i < DS::TM; ++i) {
    const int64_t r = row0 + ty + i * DS::kThreadsY;
    top1[i] = top2[i] = kNegInf;
    tval[i] = kNaN;  // stays NaN on the threads that never see the target column
    idx[i] = kNoIndex;
    tgt[i] = (a.target && r < a.n) ? a.target[r] : -1;
  }

  for (int64_t col0 = c_begin; col0 < c_end; col0 += DS::BN) {
    T acc[DS::TM][DS::TN];
    tile_product<DS, true, true>(sm, RowMajor<T>{a.y, a.ldy}, row0, a.n, RowMajor<T>{a.v, a.ldv}, col0, c_end, a.d,
                                 acc);
#pragma unroll
    for (int i = 0; i < DS::TM; ++i)
#pragma unroll
      for (int j = 0; j < DS::TN; ++j) {  // a thread's columns ascend with j and col0: strict 'beats' keeps the lowest
        const int64_t c = col0 + tx + j * DS::kThreadsX;
        if (c >= c_end) continue;
        const T s = acc[i][j];
        if (beats(s, top2[i])) {
          if (beats(s, top1[i])) {
            top2[i] = top1[i];
            top1[i] = s;
            idx[i] = c;
          } else {
            top2[i] = s;
          }
        }
        if (c == tgt[i]) tval[i] = s;
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
      // Only the target column's owner holds a number; if that score is NaN, so is the top-1 and the margin.
      if (ov == ov) tval[i] = ov;
      merge(top1[i], top2[i], idx[i], o1, o2, static_cast<int64_t>(oi));
    }
    const int64_t r = row0 + ty + i * DS::kThreadsY;
    if (tx != 0 || r >= a.n) continue;
    if (gridDim.y == 1) {
      finish(a, r, top1[i], top2[i], idx[i], tval[i]);
    } else {
      const int64_t z = blockIdx.y, splits = gridDim.y;
      a.part_val[(0 * splits + z) * a.n + r] = top1[i];
      a.part_val[(1 * splits + z) * a.n + r] = top2[i];
      a.part_val[(2 * splits + z) * a.n + r] = tval[i];  // NaN unless the target is in this range
      a.part_idx[z * a.n + r] = idx[i];
    }
  }
}

// One thread per row: merges the ranges' states in column order.
template <typename T> __global__ void decode_merge_kernel(DecodeArgs<T> a, int64_t splits, int64_t cols_per_split) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.n) return;
  T top1 = a.part_val[r], top2 = a.part_val[splits * a.n + r];
  int64_t idx = a.part_idx[r];
  for (int64_t z = 1; z < splits; ++z)
    merge(top1, top2, idx, a.part_val[z * a.n + r], a.part_val[(splits + z) * a.n + r], a.part_idx[z * a.n + r]);
  const T tval = a.target ? a.part_val[(2 * splits + a.target[r] / cols_per_split) * a.n + r] : T(0);
  finish(a, r, top1, top2, idx, tval);
}

}  // namespace

template <typename T> void decode(const DecodeArgs<T>& a, uintptr_t stream) {
  if (a.n <= 0 || a.nv <= 0) return;
  const int64_t row_blocks = ceil_div(a.n, DS::BM);
  if (row_blocks > 0x7fffffffLL) throw std::invalid_argument("decode: too many rows");
  // Ranges of whole 64-value tiles; every range is non-empty, so splits <= the requested a.splits.
  const int64_t want = (a.part_val && a.part_idx) ? std::clamp<int64_t>(a.splits, 1, 65535) : 1;
  const int64_t cols_per_split = ceil_div(ceil_div(a.nv, DS::BN), want) * DS::BN;
  const int64_t splits = ceil_div(a.nv, cols_per_split);
  const cudaStream_t st = as_stream(stream);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  decode_kernel<T><<<grid, DS::kThreads, 0, st>>>(a, cols_per_split);
  check_launch("decode");
  if (splits > 1) {
    decode_merge_kernel<T><<<static_cast<unsigned>(ceil_div(a.n, 256)), 256, 0, st>>>(a, splits, cols_per_split);
    check_launch("decode (merge)");
  }
}

template void decode<float>(const DecodeArgs<float>&, uintptr_t);
template void decode<double>(const DecodeArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
