// Fused gated MLP on the tensor cores, float32 in and out:
//   out = Wd (act(Wg x + bg)[r mod hg] * (Wu x + bu)) + bd.
//
// Why: the twin runs three cuBLAS SGEMMs (CUDA cores, ~20-25 TFLOP/s at the construction's shapes on an H100)
// and writes and reads the n x h gate, up and product matrices. This kernel never forms them, and its products
// run on the TF32 tensor cores in a 3xTF32 split: a = a_hi + a_lo, a_hi = tf32(a), a_lo = tf32(a - a_hi), and
// a b ~ a_lo b_hi + a_hi b_lo + a_hi b_hi accumulated in float32. The dropped a_lo b_lo and the rounding of
// a_lo are each <= 2^-22 |a| |b|, so every product is float32-accurate (one TF32 product is off by up to 2^-11).
//
// A block owns BM rows of x, one range of hidden units (the ranges split h across blocks so the grid fills the
// GPU at n = 4,096) and DN output columns. For each chunk of BH hidden units it computes the up tile (and the
// gate tile, unless hg <= BH shares one gate tile across all chunks: computed once per block), forms the
// product tile P (BM x BH) in shared memory, and adds P Wd_chunk^T into the warps' output fragments. The
// reduction over d_in streams through two shared-memory stages loaded with cp.async, the next slice in flight
// while the current one multiplies. At the end each block adds its BM x DN partial sum into out (atomically
// when h is split: out is zeroed first; the block of the first range adds bd).
#include <mma.h>

#include <algorithm>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {
namespace {

using namespace nvcuda;

constexpr int kThreads = 256;  // 8 warps
constexpr int BM = 64;            // rows of x a block owns
constexpr int BH = 64;            // hidden units a chunk
constexpr int BK = 32;            // reduction slice over d_in
constexpr int kPad = 4;           // floats past each shared row: 16-byte rows, fewer bank conflicts
constexpr int LDS = BK + kPad;    // stage rows (x, Wu, Wg slices)
constexpr int LDP = BH + kPad;    // P, Wd chunk and gate rows
constexpr int kMaxSharedGate = BH;  // hg up to this (and below h): one gate tile a block, reused by every chunk
constexpr int kStage = (BM + BH) * LDS;  // floats of one stage of x and weight slices

// Shared memory (floats): two stages of x and a weight slice (BM + BH rows of LDS), then the gate slices' two
// stages or, with a shared gate, the gate tile (BM x LDP), then the Wd chunk (DN x LDP; at the end the output
// tile, BM x (DN + kPad)), then P (BM x LDP). Every offset is a multiple of 32 bytes, as wmma's loads need.
template <int DN> struct Layout {
  static constexpr int kAux = 2 * BH * LDS;
  static constexpr int kWd = DN * LDP;
  static constexpr int kFloats = 2 * kStage + kAux + kWd + BM * LDP;
  static constexpr size_t kBytes = kFloats * sizeof(float);
  static_assert(BM * LDP <= kAux, "the shared gate tile fits where the gate slices would be");
  static_assert(BM * (DN + kPad) <= kWd, "the output tile fits where the Wd chunk was");
};

// TF32 WMMA and cp.async exist from sm_80 on: older targets compile a kernel that traps (launch() refuses them).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FK_TF32_TENSOR_CORES 1
#endif

#ifdef FK_TF32_TENSOR_CORES
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// ---------------------------------------------------------------- cp.async

__device__ __forceinline__ void copy_async(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));  // 0: zeros
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending> __device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Rows [row0, row_end) of a weight matrix with d_in columns; row r reads row r % period (the shared gate).
struct WeightRows {
  const float* w;
  int64_t row0, row_end;
  uint32_t period;
};

// The two stages of slices, at stage s: x (BM x LDS) then the up (or the shared gate's) weights (BH x LDS)
// from stages + s kStage, the gate weights from aux + s BH LDS; and the stage the next slice goes to.
// Offsets, not arrays of pointers: a pointer array indexed by the running stage would live in local memory.
struct Stages {
  float* stages;
  float* aux;
  int next;
  __device__ __forceinline__ float* x(int s) const { return stages + s * kStage; }
  __device__ __forceinline__ float* weights(int b, int s) const {
    return b == 0 ? stages + s * kStage + BM * LDS : aux + s * BH * LDS;
  }
};

// Slice [k0, k0 + BK) of x's rows [i0, i0 + BM) and of BH rows of each weight, zero past the ends, into
// stage st.next.
template <int NB>
__device__ __forceinline__ void load_slice(const GatedForwardArgs<float>& a, int64_t i0, int64_t k0,
                                           const Stages& st, const WeightRows (&w)[NB]) {
  // Each thread copies one column k of the slice, in rows kThreads / BK apart: coalesced along k.
  constexpr int kRowStep = kThreads / BK;
  const int k = threadIdx.x % BK, row = threadIdx.x / BK;
  const int64_t gk = k0 + k;
  const bool k_ok = gk < a.d_in;
  float* xs = st.x(st.next);
#pragma unroll 2
  for (int i = row; i < BM; i += kRowStep) {
    const int64_t gi = i0 + i;
    const bool ok = k_ok && gi < a.n;
    copy_async(xs + i * LDS + k, ok ? a.x + gi * a.ldx + gk : a.x, ok);
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    float* ws = st.weights(b, st.next);
#pragma unroll 2
    for (int j = row; j < BH; j += kRowStep) {
      const int64_t r = w[b].row0 + j;
      const bool ok = k_ok && r < w[b].row_end;
      const int64_t src = static_cast<uint32_t>(r) % w[b].period;
      copy_async(ws + j * LDS + k, ok ? w[b].w + src * a.d_in + gk : w[b].w, ok);
    }
  }
  commit_copies();
}

// Columns [r0, r0 + BH) of Wd's rows [c0, c0 + DN), zero past h_end and d_out.
template <int DN>
__device__ __forceinline__ void load_down_chunk(const GatedForwardArgs<float>& a, int64_t c0, int64_t r0,
                                                int64_t h_end, float* wds) {
  for (int e = threadIdx.x; e < DN * BH; e += kThreads) {
    const int j = e / BH, c = e % BH;
    const int64_t gj = c0 + j, gc = r0 + c;
    const bool ok = gj < a.d_out && gc < h_end;
    copy_async(wds + j * LDP + c, ok ? a.wd + gj * a.h + gc : a.wd, ok);
  }
  commit_copies();
}

// ------------------------------------------------------------ 3xTF32 products

template <class Frag> __device__ __forceinline__ void split(Frag& hi, Frag& lo) {
#pragma unroll
  for (int t = 0; t < hi.num_elements; ++t) {
    const float v = hi.x[t];
    hi.x[t] = wmma::__float_to_tf32(v);
    lo.x[t] = wmma::__float_to_tf32(v - hi.x[t]);
  }
}

// acc += part, element by element on the CUDA cores (round to nearest). The tensor cores' float32 accumulation
// truncates (rounds toward zero), so its error grows with the number of accumulating mma calls and always shrinks
// the magnitude: the H200 run of session 31 measured 1.9e-5 of the largest output at h = 4,608, d_out = 128 (the
// float32 twin: 2.5e-6), which the down product's ~430 accumulating calls a block account for. Each slice and each
// chunk is therefore multiplied into zeroed fragments and added here (Ootomo and Yokota, 2022, section 4).
template <int NB, int FM, int FN>
__device__ __forceinline__ void add_fragments(FragC (&acc)[NB][FM][FN], const FragC (&part)[NB][FM][FN]) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j)
#pragma unroll
        for (int t = 0; t < acc[b][i][j].num_elements; ++t) acc[b][i][j].x[t] += part[b][i][j].x[t];
}

template <int NB, int FM, int FN> __device__ __forceinline__ void zero_fragments(FragC (&acc)[NB][FM][FN]) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[b][i][j], 0.0f);
}

// acc[b][i][j] += A[16 i.., :] B_b[16 j.., :]^T over ksteps of 8: A row-major (lda), each B_b row-major (n, k)
// (ldb), all in shared memory. The A fragments are split once and shared by every B.
template <int NB, int FM, int FN>
__device__ __forceinline__ void mma_split(FragC (&acc)[NB][FM][FN], const float* A, int lda,
                                          const float* const (&B)[NB], int ldb, int ksteps) {
  for (int kk = 0; kk < ksteps; ++kk) {
    FragA a_hi[FM], a_lo[FM];
#pragma unroll
    for (int i = 0; i < FM; ++i) {
      wmma::load_matrix_sync(a_hi[i], A + i * 16 * lda + kk * 8, lda);
      split(a_hi[i], a_lo[i]);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        FragB b_hi, b_lo;
        wmma::load_matrix_sync(b_hi, B[b] + j * 16 * ldb + kk * 8, ldb);
        split(b_hi, b_lo);
#pragma unroll
        for (int i = 0; i < FM; ++i) {  // small terms first, so they are not lost against the large one
          wmma::mma_sync(acc[b][i][j], a_lo[i], b_hi, acc[b][i][j]);
          wmma::mma_sync(acc[b][i][j], a_hi[i], b_lo, acc[b][i][j]);
          wmma::mma_sync(acc[b][i][j], a_hi[i], b_hi, acc[b][i][j]);
        }
      }
  }
}

// Hidden tile (BM x BH) of NB weights (up; or gate and up) over d_in, into the warp's 16 x 32 fragments.
// On entry slice 0 is in flight (unless d_in = 0); kWaitOlder: one more copy group (the Wd chunk) was committed
// after it, which slice 0 need not wait for. Before the last slice is multiplied, slice 0 of the next tile
// (weights next_w) is put in flight when prefetch is set.
template <int NB, bool kWaitOlder>
__device__ __forceinline__ void hidden_tile(const GatedForwardArgs<float>& a, int64_t i0, int nk, Stages& st,
                                            const WeightRows (&w)[NB], bool prefetch, const WeightRows (&next_w)[NB],
                                            FragC (&acc)[NB][1][2]) {
  const int warp = threadIdx.x / 32;
  const int wr = warp / 2, wc = warp % 2;  // 4 x 2 warps of 16 x 32
  zero_fragments(acc);
  for (int ks = 0; ks < nk; ++ks) {
    if (kWaitOlder && ks == 0) wait_copies<1>();
    else wait_copies<0>();
    __syncthreads();  // slice ks visible to all; every warp is done with the stage the next slice overwrites
    const int cur = st.next;
    st.next ^= 1;
    if (ks + 1 < nk) load_slice<NB>(a, i0, int64_t(ks + 1) * BK, st, w);
    else if (prefetch) load_slice<NB>(a, i0, 0, st, next_w);
    const float* B[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) B[b] = st.weights(b, cur) + wc * 32 * LDS;
    mma_split<NB, 1, 2>(acc, st.x(cur) + wr * 16 * LDS, LDS, B, LDS, BK / 8);
  }
}

#endif  // FK_TF32_TENSOR_CORES

template <int DN, bool kSharedGate>
__global__ void __launch_bounds__(kThreads, 2) gated_forward_kernel(GatedForwardArgs<float> a, int64_t chunks,
                                                                   int64_t chunks_per_range) {
#ifndef FK_TF32_TENSOR_CORES
  __trap();
#else
  using L = Layout<DN>;
  extern __shared__ __align__(128) float smem[];
  float* aux = smem + 2 * kStage;  // gate slices, or the shared gate tile
  Stages st{smem, aux, 0};
  float* gate = aux;
  float* wds = aux + L::kAux;
  float* ps = wds + L::kWd;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = warp / 2, wc = warp % 2;  // the hidden tiles' 4 x 2 warps of 16 x 32
  const int64_t i0 = int64_t(blockIdx.x) * BM, c0 = int64_t(blockIdx.z) * DN;
  const int64_t first = int64_t(blockIdx.y) * chunks_per_range;
  const int64_t last = first + chunks_per_range < chunks ? first + chunks_per_range : chunks;
  const int64_t h_end = last * BH < a.h ? last * BH : a.h;
  const int nk = static_cast<int>((a.d_in + BK - 1) / BK);
  const uint32_t hg = static_cast<uint32_t>(a.hg);

  // Output fragments: DN / 32 warps across, 32 columns each; the rest of BM down.
  constexpr int kOutWarpsN = DN / 32, FMO = BM / 16 / (kThreads / 32 / kOutWarpsN);
  const int owr = warp / kOutWarpsN, owc = warp % kOutWarpsN;
  FragC out_acc[1][FMO][2];
  zero_fragments(out_acc);

  // The lanes' column of the warp's 16 x 32 region of a hidden tile, and that region in shared memory.
  const int col = wc * 32 + lane;
  float* region = ps + wr * 16 * LDP + wc * 32;

  if constexpr (kSharedGate) {
    // gate[i, t] = act(x_i . wg_t + bg_t) for t < hg <= BH, 0 past hg: once per block.
    const WeightRows g[1] = {{a.wg, 0, a.hg, hg}};
    if (nk > 0) load_slice<1>(a, i0, 0, st, g);
    FragC acc[1][1][2];
    hidden_tile<1, false>(a, i0, nk, st, g, false, g, acc);
    float* gregion = gate + wr * 16 * LDP + wc * 32;
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(gregion + j * 16, acc[0][0][j], LDP, wmma::mem_row_major);
    __syncwarp();
    const float bias = (col < a.hg && a.bg) ? a.bg[col] : 0.0f;
    for (int i = 0; i < 16; ++i) {
      float& v = gregion[i * LDP + lane];
      v = col < a.hg ? activate(a.act, v + bias) : 0.0f;
    }
    __syncthreads();  // the gate tile is read across warps; the stages are free again
  }

  constexpr int NB = kSharedGate ? 1 : 2;
  auto weights = [&](int64_t r0, WeightRows (&w)[NB]) {
    w[0] = {a.wu, r0, h_end, static_cast<uint32_t>(a.h)};
    if constexpr (!kSharedGate) w[NB - 1] = {a.wg, r0, h_end, hg};
  };
  if (first < last && nk > 0) {
    WeightRows w[NB];
    weights(first * BH, w);
    load_slice<NB>(a, i0, 0, st, w);
  }
  for (int64_t c = first; c < last; ++c) {
    const int64_t r0 = c * BH;
    if (c > first) __syncthreads();  // every warp is done with the last chunk's Wd and P
    load_down_chunk<DN>(a, c0, r0, h_end, wds);
    WeightRows w[NB], next_w[NB];
    weights(r0, w);
    weights(r0 + BH, next_w);
    FragC acc[NB][1][2];
    hidden_tile<NB, true>(a, i0, nk, st, w, c + 1 < last, next_w, acc);

    // P = act(gate + bg) * (up + bu) in the warp's region, 0 past h_end. Fragments' element order is opaque,
    // so the biases and the gate go through shared memory: up is stored, biased, and loaded back.
    const int64_t r = r0 + col;
    const bool in = r < h_end;
    const float bu = (in && a.bu) ? a.bu[r] : 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(region + j * 16, acc[0][0][j], LDP, wmma::mem_row_major);
    __syncwarp();
    if constexpr (kSharedGate) {
      const float* g = gate + wr * 16 * LDP + static_cast<uint32_t>(in ? r : 0) % hg;
      for (int i = 0; i < 16; ++i) {
        float& v = region[i * LDP + lane];
        v = in ? (v + bu) * g[i * LDP] : 0.0f;
      }
    } else {
      for (int i = 0; i < 16; ++i) {
        float& v = region[i * LDP + lane];
        v = in ? v + bu : 0.0f;
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(acc[0][0][j], region + j * 16, LDP, wmma::mem_row_major);
      __syncwarp();  // every lane has read up before the gate overwrites it
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(region + j * 16, acc[NB - 1][0][j], LDP, wmma::mem_row_major);
      __syncwarp();
      const float bg = (in && a.bg) ? a.bg[static_cast<uint32_t>(r) % hg] : 0.0f;
      for (int i = 0; i < 16; ++i) {
        float& v = region[i * LDP + lane];
        v = activate(a.act, v + bg);
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(acc[NB - 1][0][j], region + j * 16, LDP, wmma::mem_row_major);
#pragma unroll
        for (int t = 0; t < acc[0][0][j].num_elements; ++t) acc[0][0][j].x[t] *= acc[NB - 1][0][j].x[t];
      }
      __syncwarp();  // every lane has read the gate before the product overwrites it
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(region + j * 16, acc[0][0][j], LDP, wmma::mem_row_major);
    }
    if (nk <= 1) wait_copies<0>();  // the Wd chunk was not waited for in the slices
    __syncthreads();                // P and the Wd chunk visible to all
    const float* const B[1] = {wds + owc * 32 * LDP};
    FragC part[1][FMO][2];
    zero_fragments(part);
    mma_split<1, FMO, 2>(part, ps + owr * FMO * 16 * LDP, LDP, B, LDP, BH / 8);
    add_fragments(out_acc, part);
  }

  // The output tile goes through shared memory so the stores (or atomic adds) are coalesced.
  wait_copies<0>();
  __syncthreads();
  constexpr int LDO = DN + kPad;
#pragma unroll
  for (int i = 0; i < FMO; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(wds + (owr * FMO + i) * 16 * LDO + owc * 32 + j * 16, out_acc[0][i][j], LDO,
                              wmma::mem_row_major);
  __syncthreads();
  const bool split_h = gridDim.y > 1;
  for (int e = threadIdx.x; e < BM * DN; e += kThreads) {
    const int i = e / DN, j = e % DN;
    const int64_t gi = i0 + i, gj = c0 + j;
    if (gi >= a.n || gj >= a.d_out) continue;
    float v = wds[i * LDO + j];
    if (blockIdx.y == 0 && a.bd) v += a.bd[gj];
    float* o = a.out + gi * a.ldo + gj;
    if (split_h) atomicAdd(o, v);
    else *o = v;
  }
#endif
}

template <int DN, bool kSharedGate> void launch(const GatedForwardArgs<float>& a, cudaStream_t stream) {
  auto kernel = gated_forward_kernel<DN, kSharedGate>;
  constexpr size_t bytes = Layout<DN>::kBytes;
  // Resident blocks on the whole device, found once per device (the attribute is set with it).
  constexpr int kMaxDevices = 64;
  static int slots_by_device[kMaxDevices] = {};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int slots = device < kMaxDevices ? slots_by_device[device] : 0;
  if (slots == 0) {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    if (major < 8) throw std::runtime_error("gated_forward's CUDA kernel needs sm_80 or newer (TF32 tensor cores)");
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
          "gated_forward: shared memory");
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, bytes), "gated_forward: occupancy");
    slots = std::max(per_sm, 1) * multiprocessor_count();
    if (device < kMaxDevices) slots_by_device[device] = slots;
  }
  const int64_t row_tiles = ceil_div(a.n, BM), col_tiles = ceil_div(a.d_out, DN);
  const int64_t chunks = ceil_div(a.h, BH);
  // Split h into as many ranges as keep one wave of resident blocks busy (n = 4,096: 64 row tiles, 2 blocks
  // an SM on 132 SMs -> 4 ranges, 256 blocks); more ranges only add atomic traffic.
  int64_t ranges = std::clamp<int64_t>(slots / (row_tiles * col_tiles), 1, std::max<int64_t>(chunks, 1));
  const int64_t per_range = std::max<int64_t>(1, ceil_div(chunks, ranges));
  ranges = std::max<int64_t>(1, ceil_div(chunks, per_range));
  if (row_tiles > 0x7fffffff || col_tiles > 65535) throw std::invalid_argument("gated_forward: n or d_out too large");
  if (ranges > 1) check(cudaMemset2DAsync(a.out, a.ldo * sizeof(float), 0, a.d_out * sizeof(float), a.n, stream),
                        "gated_forward: zero out");
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(ranges), static_cast<unsigned>(col_tiles));
  kernel<<<grid, kThreads, bytes, stream>>>(a, chunks, per_range);
  check_launch("gated_forward");
}

}  // namespace

void gated_forward(const GatedForwardArgs<float>& a, uintptr_t stream) {
  if (a.n <= 0 || a.d_out <= 0) return;
  if (a.hg <= 0 || a.h % a.hg) throw std::invalid_argument("gated_forward: hg must divide h");
  const bool shared_gate = a.hg < a.h && a.hg <= kMaxSharedGate;
  const cudaStream_t st = as_stream(stream);
  if (a.d_out <= 64) {
    shared_gate ? launch<64, true>(a, st) : launch<64, false>(a, st);
  } else {
    shared_gate ? launch<128, true>(a, st) : launch<128, false>(a, st);
  }
}

}  // namespace cuda
}  // namespace factkernels
