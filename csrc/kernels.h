// factkernels kernel interface: plain structs of pointers, shapes and leading
// dimensions. Nothing here knows Python or torch; bindings.cpp fills these
// structs from the integers that factkernels/_ops.py passes.
//
// Conventions (all matrices row-major, unit stride in the last dimension):
//   ld*        leading dimension (row stride, in elements) of a 2-D operand
//   dtype      float or double, chosen by a template parameter
//   act        activation code, see Activation below
//   stream     cudaStream_t as an integer (CUDA entry points only; 0 = default)
#pragma once
#include <cstdint>

namespace factkernels {

// Analytic, non-polynomial activations (the gated gadget needs one: Lemma 4.1.2).
enum class Activation : int {
  kSilu = 0,      // x * sigmoid(x)   (Swish, SwiGLU)
  kGelu = 1,      // x * Phi(x), exact erf form (GeGLU)
  kTanh = 2,
  kSigmoid = 3,
  kSoftplus = 4,  // log(1 + e^x)
};

// out[i, r] = act(sum_c x[i, c] * w[r, c] + b[r])        x: (n, k), w: (h, k), out: (n, h)
template <typename T>
struct GateFeaturesArgs {
  const T* x; int64_t ldx;
  const T* w; int64_t ldw;
  const T* b;            // may be null (no bias)
  T* out; int64_t ldo;
  int64_t n, k, h;
  Activation act;
};

// out[i, j] = (sum_r s[i, r] s[j, r]) * (sum_c p[i, c] p[j, c])     s: (n, h), p: (n, q), out: (n, n)
// The full symmetric matrix is written (lower triangle computed, then mirrored).
template <typename T>
struct HadamardGramArgs {
  const T* s; int64_t lds;
  const T* p; int64_t ldp;
  T* out; int64_t ldo;
  int64_t n, h, q;
  bool lower_only;  // write the lower triangle (diagonal included) only, as a lower Cholesky reads it
};

// Gadget operator M (row i of M is s[i, :] (x) p[i, :], a face-splitting product)
// applied to m right-hand sides at once; M is never formed.
//   matvec:  out[i, j]    = sum_r s[i, r] * sum_c p[i, c] * coef[j, r, c]     coef: (m, h, q) contiguous, out: (n, m)
//   rmatvec: out[j, r, c] = sum_i y[i, j] * s[i, r] * p[i, c]                 y: (n, m), out: (m, h, q) contiguous
template <typename T>
struct GadgetProductArgs {
  const T* s; int64_t lds;
  const T* p; int64_t ldp;
  const T* in;   // coef (matvec) or y (rmatvec, leading dimension ldy)
  int64_t ldy;   // row stride of y (rmatvec) / of out (matvec)
  T* out;
  int64_t n, h, q, m;
};

// Fused gated MLP:  out[i] = Wd (act(Wg x_i + bg)[r mod hg] * (Wu x_i + bu)) + bd
//   x: (n, d_in), wg: (hg, d_in) with hg dividing h (hg < h shares gate rows
//   across gadgets, row r uses gate r mod hg), wu: (h, d_in), wd: (d_out, h), out: (n, d_out).
//   Any bias pointer may be null.
template <typename T>
struct GatedForwardArgs {
  const T* x; int64_t ldx;
  const T* wg; const T* bg;
  const T* wu; const T* bu;
  const T* wd; const T* bd;
  T* out; int64_t ldo;
  int64_t n, d_in, h, hg, d_out;
  Activation act;
};

// Fused decode, streaming over v in tiles with O(n + nv) extra memory:
//   index[i]  = argmax_j <y_i, v_j>        (lowest j on ties)
//   margin[i] = <y_i, v_t> - max_{j != t} <y_i, v_j>, where t = target[i] when
//               target is given, else t = index[i] (top-1 minus top-2 score).
//   y: (n, d), v: (nv, d), target: (n,) int64 in [0, nv) or null; index: (n,) int64; margin: (n,)
// NaN scores count as the largest (as torch.argmax does): a row with any NaN score gets
// index = its lowest NaN column and margin = NaN.
template <typename T>
struct DecodeArgs {
  const T* y; int64_t ldy;
  const T* v; int64_t ldv;
  const int64_t* target;
  int64_t* index;
  T* margin;
  int64_t n, nv, d;
};

// Smallest star scores of outputs against values, streaming over w in tiles with
// O(r k) state, never forming the r x n score matrix (margin-optimal outputs, seed 000 Def. 3.2.1):
//   score(i, j) = <p_i, w_s - w_j> / ||w_s - w_j||   for j != s = self[i]
//   p_i = w_s when p is null (the outputs are the values themselves).
//   ||w_s - w_j||^2 = sq[s] + sq[j] - 2 <w_s, w_j> (one GEMM tile each for <p_i, w_j> and
//   <w_s, w_j>), or from the explicit difference when that is at most kCloseRel (sq[s] + sq[j])
//   (cancellation; kCloseRel = 1e-6 double, 1e-3 float); identical values score 0.
//   vals[i, :k] ascending (lowest j first on ties), idx[i, :k]; +inf and -1 past the n - 1 others.
//   p: (r, d) or null, w: (n, d), sq: (n,) = |w_j|^2, self: (r,) int64 in [0, n); vals, idx: (r, k)
//   CUDA only: splits > 1 splits the values into ranges (few rows would leave the GPU idle), each range's
//   lists go to part_vals / part_idx (splits * r * k, caller-owned) and are merged in range order.
template <typename T>
struct StarTopkArgs {
  const T* p; int64_t ldp;
  const T* w; int64_t ldw;
  const T* sq;
  const int64_t* self;
  T* vals;
  int64_t* idx;
  int64_t r, n, d, k;
  int64_t splits;
  T* part_vals; int64_t* part_idx;
};

// Star scores of given pairs from explicit differences (the float64 re-check of streamed candidates):
//   out[i, q] = <u_i, w_s - w_j> / ||w_s - w_j||, s = self[i], j = cols[i, q]; 0 for identical values, +inf for
//   j = -1.   u: (r, d), w: (n, d), self: (r,), cols: (r, c) int64 in [-1, n); out: (r, c) contiguous.
//   Out-of-range indices throw std::invalid_argument (checked before anything is read).
template <typename T>
struct StarScoresArgs {
  const T* u; int64_t ldu;
  const T* w; int64_t ldw;
  const int64_t* self;
  const int64_t* cols;
  T* out;
  int64_t r, c, d, n;
};

// Fused max-over-heads attention scores (seed 002, Sec. 3), never forming (batch, h, lq, lk):
//   scores[b, p, q]   = max_k <q[b, k, p, :], k[b, k, q, :]>
//   decision[b, p, q] = scores[b, p, q] > tau[b]
//   q: (batch, h, lq, dk), k: (batch, h, lk, dk), both contiguous; scores: (batch, lq, lk)
//   contiguous, or null (decision only); decision: (batch, lq, lk) uint8 (0/1), or null;
//   tau: (batch,) thresholds, null exactly when decision is null. A NaN score wins the max.
template <typename T>
struct MaxHeadScoresArgs {
  const T* q;
  const T* k;
  const T* tau;
  T* scores;
  uint8_t* decision;
  int64_t batch, h, lq, lk, dk;
};

// Row-wise softmax cross-entropy (the GD baselines' loss), one read of each row of scores:
//   top[i]     = max_j s[i, j]
//   loss[i]    = log(sum_j e[i, j]) + top[i] - s[i, t],   e[i, j] = exp(max(s[i, j] - top[i], -floor)), t = target[i]
//   hit[i]     = s[i, t] >= top[i]   (uint8 0/1; a tie for the top counts as a hit)
//   prob[i, j] = e[i, j] / sum_j e[i, j]   (the softmax, what the gradient needs; prob may equal s)
//   s: (n, c), target: (n,) int64 in [0, c), loss: (n,), hit: (n,), prob: (n, c).
// A row holding a NaN gets loss NaN, hit 0 and prob NaN (as torch's amax propagates it).
template <typename T>
struct SoftmaxXentArgs {
  const T* s; int64_t lds;
  const int64_t* target;
  T* loss;
  uint8_t* hit;
  T* prob; int64_t ldp;
  int64_t n, c;
  T floor;
};

// Minor cycles of Wolfe's minimum-norm-point method, one corral per row (U*, factkernels/corral.py), float64:
//   q: (r, kb, kb) Gram matrices of each row's slot vectors; lam: (r, kb) simplex weights and occ: (r, kb)
//   corral membership (uint8 0/1), both updated in place on the first ke slots; frozen: (r,) rows left as
//   they are; settled: (r,) out, 1 where the row's minor cycle finished.
// Each step solves (Q_S + 1 1^T + ridge I) z = 1 on the corral S (one refinement against the system
// without ridge unless fast), y = z / sum(z), then clips the weights <= eps_w (fast, one step) or moves
// towards y until the first weight reaches 0 (Wolfe, up to max_steps). A row whose system is not positive
// definite keeps its weights (settled). The factor of a step loses dropped points by rank-1 updates.
struct CorralMinorArgs {
  const double* q;
  double* lam;
  uint8_t* occ;
  const uint8_t* frozen;
  uint8_t* settled;
  int64_t r, kb, ke;
  int fast;
  int64_t max_steps;
  double eps_w, ridge;
};

// Whole minimum-norm-point solves of candidate stars, one row per task (U*'s active-set rounds), float64:
//   w: (n, d) centred values; rows: (r,) the rows' values; cand: (r, k) candidate values (-1 padding), the
//   star of row t is x_c = (w[rows[t]] - w[cand[t, c]]) / ||...||; start: (r, d) start directions (used when
//   the warm corral is empty); warm_cols, warm_lam: (r, kw) a warm corral (positions into cand, -1 none, and
//   weights; may be null with kw = 0). Wolfe's method, up to n_init points added to an empty corral and
//   n_add per later major cycle, until (||p||^2 - min_c <x_c, p>) <= tol ||p||^2, ||p||^2 <= zero_norm2, a
//   stall, or max_iter major cycles. Out: u (r, d) the unit direction of the best margin seen, lo (r,) that
//   margin, hi (r,) the smallest hull-point norm (inf if none), out_cols / out_lam (r, kc) the final corral
//   (positions into cand, -1 padding, and weights), dup (r,) 1 where a candidate duplicates the row's value.
//   CUDA only (the CPU kernel ignores them): work, corral_solve_work(d, k, slots) doubles on the device, a row
//   counter then one scratch slice per warp; slots warps run, each solving rows until none is left.
//   CPU only (null: none; the CUDA kernel runs the same steps): steps (r, kCorralSolveSteps), each row's counts in
//   the order of CorralSolveStep.
struct CorralSolveArgs {
  const double* w;
  int64_t n, d;
  const int64_t* rows;
  const int64_t* cand;
  int64_t r, k;
  const double* start;
  const int64_t* warm_cols;
  const double* warm_lam;
  int64_t kw;
  double tol;
  int64_t max_iter, n_init, n_add;
  double eps_w, ridge, zero_norm2;
  double* u;
  double* lo;
  double* hi;
  int64_t* out_cols;
  double* out_lam;
  int64_t kc;
  uint8_t* dup;
  double* work;
  int64_t slots;
  int64_t* steps;
};

// What corral_solve's steps count per row: major cycles (certificate passes), points added to the corral (the warm
// corral's included), minor-cycle steps (each two Cholesky solves of the corral's system) and the corral sizes
// summed over them (the length of their substitution chains), drops and the rotations they took (as many of the
// factor's rows move up), the largest corral and the warm corral's size.
enum CorralSolveStep { kMajorCycles, kAdded, kMinorSteps, kSolveRows, kDrops, kRotations, kLargestCorral, kWarmCorral,
                       kCorralSolveSteps };

// The CUDA corral_solve's workspace, in doubles: a header (the row counter), then per warp its candidate star
// (k x d), certificates (k), the corral's Gram matrix and factor ((d + 1)^2 each), five slot vectors, the point
// and the best direction (d each), a group of additions' products with the corral and their forward-solved
// borders (2 x kCorralSolveGroup x (d + 1)), the slots' candidates (d + 1 ints) and the candidates' flags
// (k bytes), rounded up to 256 bytes.
constexpr int64_t kCorralSolveHeader = 32;
constexpr int kCorralSolveGroup = 4;  // additions whose products with the corral take one pass over its rows
inline int64_t corral_solve_scratch(int64_t d, int64_t k) {
  const int64_t mmax = d + 1;
  const int64_t doubles = k * d + k + (2 * mmax + 2 * kCorralSolveGroup + 6) * mmax + 2 * d + (k + 7) / 8;
  return (doubles + 31) / 32 * 32;
}
inline int64_t corral_solve_work(int64_t d, int64_t k, int64_t slots) {
  return kCorralSolveHeader + slots * corral_solve_scratch(d, k);
}

namespace cpu {
void corral_minor(const CorralMinorArgs& a);
void corral_solve(const CorralSolveArgs& a);
template <typename T> void softmax_xent(const SoftmaxXentArgs<T>& a);
template <typename T> void gate_features(const GateFeaturesArgs<T>& a);
template <typename T> void hadamard_gram(const HadamardGramArgs<T>& a);
template <typename T> void gadget_matvec(const GadgetProductArgs<T>& a);
template <typename T> void gadget_rmatvec(const GadgetProductArgs<T>& a);
template <typename T> void gated_forward(const GatedForwardArgs<T>& a);
template <typename T> void decode(const DecodeArgs<T>& a);
template <typename T> void max_head_scores(const MaxHeadScoresArgs<T>& a);
template <typename T> void star_topk(const StarTopkArgs<T>& a);
template <typename T> void star_scores(const StarScoresArgs<T>& a);
int num_threads();
}  // namespace cpu

#ifdef FACTKERNELS_CUDA
// No CUDA gadget products, gated_forward, decode or gate_features: on an H100 and an H200 their
// shared-memory float32 kernels ran at 0.26-0.97x of the cuBLAS-backed torch twins (gate_features at
// the construction's shape 0.73x on an H200 twice; gated_forward on the tensor cores, 3xTF32, 0.63-0.79x at
// d = 128), which run on a GPU instead (docs/results/kernels.md, "Kernels that earn their place";
// benchmarks/runs/gpu/NOTES.md).
namespace cuda {
template <typename T> void softmax_xent(const SoftmaxXentArgs<T>& a, uintptr_t stream);
template <typename T> void hadamard_gram(const HadamardGramArgs<T>& a, uintptr_t stream);
template <typename T> void max_head_scores(const MaxHeadScoresArgs<T>& a, uintptr_t stream);
template <typename T> void star_topk(const StarTopkArgs<T>& a, uintptr_t stream);
void corral_solve(const CorralSolveArgs& a, uintptr_t stream);  // one warp per row (U*'s active-set rounds)
int device_count();
// Makes `device` current for its lifetime, then restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};
int runtime_version();  // CUDART_VERSION this module was compiled against (1000 * major + 10 * minor)
int driver_version();   // what the installed driver supports, 0 without one
}  // namespace cuda
#endif

}  // namespace factkernels
