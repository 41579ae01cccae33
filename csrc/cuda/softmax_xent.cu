// Row-wise softmax cross-entropy: one block per row, block reductions for the max and the sum.
#include <cuda/std/limits>

#include <limits>
#include <stdexcept>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// a wins the max when it is larger or a NaN (NaN propagates, as torch's amax does).
template <typename T> __device__ __forceinline__ T nan_max(T a, T b) { return (a > b || a != a) ? a : b; }

// Every thread gets the reduction of its block's values; ``shared`` holds kThreads / 32 entries.
template <typename T, class Op> __device__ __forceinline__ T block_reduce(T v, T* shared, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) v = op(v, shared[w]);
  return v;
}

template <typename T> __global__ void __launch_bounds__(kThreads) softmax_xent_kernel(SoftmaxXentArgs<T> a) {
  __shared__ T shared[kThreads / 32];
  const int64_t i = blockIdx.x;
  const T* s = a.s + i * a.lds;
  T* p = a.prob + i * a.ldp;
  const T own = s[a.target[i]];  // before p (which may be s) is written
  T top = -::cuda::std::numeric_limits<T>::infinity();
  for (int64_t j = threadIdx.x; j < a.c; j += kThreads) top = nan_max(s[j], top);
  top = block_reduce(top, shared, [](T x, T y) { return nan_max(x, y); });
  T sum = 0;
  for (int64_t j = threadIdx.x; j < a.c; j += kThreads) {
    T d = s[j] - top;
    d = d < -a.floor ? -a.floor : d;  // NaN stays NaN
    const T e = exp(d);
    p[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, shared, [](T x, T y) { return x + y; });
  const T inv = T(1) / sum;
  for (int64_t j = threadIdx.x; j < a.c; j += kThreads) p[j] *= inv;
  if (threadIdx.x == 0) {
    a.loss[i] = log(sum) + top - own;
    a.hit[i] = own >= top ? 1 : 0;
  }
}

}  // namespace

template <typename T> void softmax_xent(const SoftmaxXentArgs<T>& a, uintptr_t stream) {
  if (a.n <= 0 || a.c <= 0) return;
  if (a.n > std::numeric_limits<int>::max()) throw std::invalid_argument("softmax_xent: too many rows");
  softmax_xent_kernel<T><<<static_cast<unsigned>(a.n), kThreads, 0, as_stream(stream)>>>(a);
  check_launch("softmax_xent");
}

template void softmax_xent<float>(const SoftmaxXentArgs<float>&, uintptr_t);
template void softmax_xent<double>(const SoftmaxXentArgs<double>&, uintptr_t);

}  // namespace cuda
}  // namespace factkernels
