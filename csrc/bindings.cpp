// The only file that knows pybind11. Each entry point takes a device name, a
// dtype name and the integers (pointers, leading dimensions, shapes, stream)
// that factkernels/_ops.py has validated, fills a plain args struct and calls
// the CPU or CUDA kernel. No tensors cross this boundary.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "kernels.h"

namespace py = pybind11;
using namespace factkernels;

namespace {

template <typename T> const T* cptr(uintptr_t p) { return reinterpret_cast<const T*>(p); }
template <typename T> T* mptr(uintptr_t p) { return reinterpret_cast<T*>(p); }

// "cpu" -> -1; "cuda:N" -> N (the device every pointer of the call lives on).
int device_index(const std::string& device) {
  if (device == "cpu") return -1;
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos) {
#ifdef FACTKERNELS_CUDA
    return std::stoi(device.substr(5));
#else
    throw std::runtime_error("factkernels was built without CUDA kernels");
#endif
  }
  throw std::invalid_argument("device must be 'cpu' or 'cuda:N', got '" + device + "'");
}

// Runs f<float>() or f<double>() by dtype name.
template <typename F> void dispatch_dtype(const std::string& dtype, F&& f) {
  if (dtype == "float32") f(float{});
  else if (dtype == "float64") f(double{});
  else throw std::invalid_argument("dtype must be 'float32' or 'float64', got '" + dtype + "'");
}

Activation to_activation(int code) {
  if (code < 0 || code > static_cast<int>(Activation::kSoftplus))
    throw std::invalid_argument("unknown activation code " + std::to_string(code));
  return static_cast<Activation>(code);
}

// Calls the CPU or the CUDA instantiation of one kernel with one args struct; a CUDA
// launch runs with the tensors' device current (whatever device the caller had current).
#ifdef FACTKERNELS_CUDA
#define FK_LAUNCH(kernel, args, dev, stream)     \
  do {                                           \
    if (dev >= 0) {                              \
      cuda::DeviceGuard guard(dev);              \
      cuda::kernel(args, stream);                \
    } else {                                     \
      cpu::kernel(args);                         \
    }                                            \
  } while (0)
#else
#define FK_LAUNCH(kernel, args, dev, stream) \
  do { (void)(dev); (void)(stream); cpu::kernel(args); } while (0)
#endif

// A kernel with no CUDA instantiation (its torch twin is faster on a GPU); _ops.py never sends
// it a CUDA tensor, so a device index here is a caller's bug.
#define FK_LAUNCH_CPU(kernel, args, dev, stream)                                          \
  do {                                                                                   \
    (void)(stream);                                                                      \
    if (dev >= 0) throw std::invalid_argument(#kernel " has no CUDA kernel (CPU only)"); \
    cpu::kernel(args);                                                                   \
  } while (0)

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "factkernels compiled kernels (CPU always, CUDA when built with nvcc)";

  m.def("gate_features",
        [](const std::string& device, const std::string& dtype, uintptr_t x, int64_t ldx,
           uintptr_t w, int64_t ldw, uintptr_t b, uintptr_t out, int64_t ldo, int64_t n,
           int64_t k, int64_t h, int act, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            GateFeaturesArgs<T> a{cptr<T>(x), ldx, cptr<T>(w), ldw, cptr<T>(b),
                                  mptr<T>(out), ldo, n, k, h, to_activation(act)};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(gate_features, a, dev, stream);
          });
        });

  m.def("hadamard_gram",
        [](const std::string& device, const std::string& dtype, uintptr_t s, int64_t lds,
           uintptr_t p, int64_t ldp, uintptr_t out, int64_t ldo, int64_t n, int64_t h, int64_t q,
           bool lower_only, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            HadamardGramArgs<T> a{cptr<T>(s), lds, cptr<T>(p), ldp, mptr<T>(out), ldo, n, h, q, lower_only};
            py::gil_scoped_release nogil;
            FK_LAUNCH(hadamard_gram, a, dev, stream);
          });
        });

  m.def("gadget_matvec",
        [](const std::string& device, const std::string& dtype, uintptr_t s, int64_t lds,
           uintptr_t p, int64_t ldp, uintptr_t coef, uintptr_t out, int64_t ldo, int64_t n,
           int64_t h, int64_t q, int64_t mm, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            GadgetProductArgs<T> a{cptr<T>(s), lds, cptr<T>(p), ldp, cptr<T>(coef), ldo,
                                   mptr<T>(out), n, h, q, mm};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(gadget_matvec, a, dev, stream);
          });
        });

  m.def("gadget_rmatvec",
        [](const std::string& device, const std::string& dtype, uintptr_t s, int64_t lds,
           uintptr_t p, int64_t ldp, uintptr_t y, int64_t ldy, uintptr_t out, int64_t n,
           int64_t h, int64_t q, int64_t mm, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            GadgetProductArgs<T> a{cptr<T>(s), lds, cptr<T>(p), ldp, cptr<T>(y), ldy,
                                   mptr<T>(out), n, h, q, mm};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(gadget_rmatvec, a, dev, stream);
          });
        });

  m.def("gated_forward",
        [](const std::string& device, const std::string& dtype, uintptr_t x, int64_t ldx,
           uintptr_t wg, uintptr_t bg, uintptr_t wu, uintptr_t bu, uintptr_t wd, uintptr_t bd,
           uintptr_t out, int64_t ldo, int64_t n, int64_t d_in, int64_t h, int64_t hg,
           int64_t d_out, int act, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            GatedForwardArgs<T> a{cptr<T>(x), ldx, cptr<T>(wg), cptr<T>(bg), cptr<T>(wu),
                                  cptr<T>(bu), cptr<T>(wd), cptr<T>(bd), mptr<T>(out), ldo,
                                  n, d_in, h, hg, d_out, to_activation(act)};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(gated_forward, a, dev, stream);
          });
        });

  m.def("decode",
        [](const std::string& device, const std::string& dtype, uintptr_t y, int64_t ldy,
           uintptr_t v, int64_t ldv, uintptr_t target, uintptr_t index, uintptr_t margin,
           int64_t n, int64_t nv, int64_t d, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            DecodeArgs<T> a{cptr<T>(y), ldy, cptr<T>(v), ldv,
                            reinterpret_cast<const int64_t*>(target),
                            reinterpret_cast<int64_t*>(index), mptr<T>(margin), n, nv, d};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(decode, a, dev, stream);
          });
        });

  m.def("max_head_scores",
        [](const std::string& device, const std::string& dtype, uintptr_t q, uintptr_t k, uintptr_t tau,
           uintptr_t scores, uintptr_t decision, int64_t batch, int64_t h, int64_t lq, int64_t lk, int64_t dk,
           uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            MaxHeadScoresArgs<T> a{cptr<T>(q), cptr<T>(k), cptr<T>(tau), mptr<T>(scores),
                                   reinterpret_cast<uint8_t*>(decision), batch, h, lq, lk, dk};
            py::gil_scoped_release nogil;
            FK_LAUNCH(max_head_scores, a, dev, stream);
          });
        });

  m.def("star_topk",
        [](const std::string& device, const std::string& dtype, uintptr_t p, int64_t ldp, uintptr_t w,
           int64_t ldw, uintptr_t sq, uintptr_t self, uintptr_t vals, uintptr_t idx, int64_t r, int64_t n,
           int64_t d, int64_t k, int64_t splits, uintptr_t part_vals, uintptr_t part_idx, uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            StarTopkArgs<T> a{cptr<T>(p), ldp, cptr<T>(w), ldw, cptr<T>(sq),
                              reinterpret_cast<const int64_t*>(self), mptr<T>(vals),
                              reinterpret_cast<int64_t*>(idx), r, n, d, k, splits, mptr<T>(part_vals),
                              reinterpret_cast<int64_t*>(part_idx)};
            py::gil_scoped_release nogil;
            FK_LAUNCH(star_topk, a, dev, stream);
          });
        });

  m.def("star_scores",
        [](const std::string& device, const std::string& dtype, uintptr_t u, int64_t ldu, uintptr_t w, int64_t ldw,
           uintptr_t self, uintptr_t cols, uintptr_t out, int64_t r, int64_t c, int64_t d, int64_t n) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            StarScoresArgs<T> a{cptr<T>(u), ldu, cptr<T>(w), ldw, reinterpret_cast<const int64_t*>(self),
                                reinterpret_cast<const int64_t*>(cols), mptr<T>(out), r, c, d, n};
            py::gil_scoped_release nogil;
            FK_LAUNCH_CPU(star_scores, a, dev, 0);
          });
        });

  m.def("corral_minor",
        [](const std::string& device, uintptr_t q, uintptr_t lam, uintptr_t occ, uintptr_t frozen, uintptr_t settled,
           int64_t r, int64_t kb, int64_t ke, bool fast, int64_t max_steps, double eps_w, double ridge) {
          const int dev = device_index(device);
          CorralMinorArgs a{cptr<double>(q), mptr<double>(lam), mptr<uint8_t>(occ), cptr<uint8_t>(frozen),
                            mptr<uint8_t>(settled), r, kb, ke, fast ? 1 : 0, max_steps, eps_w, ridge};
          py::gil_scoped_release nogil;
          FK_LAUNCH_CPU(corral_minor, a, dev, 0);
        });

  m.def("corral_solve",
        [](const std::string& device, uintptr_t w, int64_t n, int64_t d, uintptr_t rows, uintptr_t cand, int64_t r,
           int64_t k, uintptr_t start, uintptr_t warm_cols, uintptr_t warm_lam, int64_t kw, double tol,
           int64_t max_iter, int64_t n_init, int64_t n_add, double eps_w, double ridge, double zero_norm2,
           uintptr_t u, uintptr_t lo, uintptr_t hi, uintptr_t out_cols, uintptr_t out_lam, int64_t kc,
           uintptr_t dup, uintptr_t work, int64_t slots, uintptr_t steps, uintptr_t stream) {
          const int dev = device_index(device);
          CorralSolveArgs a{cptr<double>(w), n, d, cptr<int64_t>(rows), cptr<int64_t>(cand), r, k,
                            cptr<double>(start), cptr<int64_t>(warm_cols), cptr<double>(warm_lam), kw, tol,
                            max_iter, n_init, n_add, eps_w, ridge, zero_norm2, mptr<double>(u), mptr<double>(lo),
                            mptr<double>(hi), mptr<int64_t>(out_cols), mptr<double>(out_lam), kc,
                            mptr<uint8_t>(dup), mptr<double>(work), slots, mptr<int64_t>(steps)};
          py::gil_scoped_release nogil;
          FK_LAUNCH(corral_solve, a, dev, stream);
        });

  // Doubles of the CUDA corral_solve's workspace for `slots` warps (kernels.h).
  m.def("corral_solve_work", [](int64_t d, int64_t k, int64_t slots) { return corral_solve_work(d, k, slots); });

  m.def("softmax_xent",
        [](const std::string& device, const std::string& dtype, uintptr_t s, int64_t lds, uintptr_t target,
           uintptr_t loss, uintptr_t hit, uintptr_t prob, int64_t ldp, int64_t n, int64_t c, double floor,
           uintptr_t stream) {
          const int dev = device_index(device);
          dispatch_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            SoftmaxXentArgs<T> a{cptr<T>(s), lds, reinterpret_cast<const int64_t*>(target), mptr<T>(loss),
                                 reinterpret_cast<uint8_t*>(hit), mptr<T>(prob), ldp, n, c, static_cast<T>(floor)};
            py::gil_scoped_release nogil;
            FK_LAUNCH(softmax_xent, a, dev, stream);
          });
        });

  m.def("build_info", []() {
    py::dict info;
#ifdef FACTKERNELS_CUDA
    info["cuda"] = true;
#ifdef FACTKERNELS_CUDA_ARCHS
    info["cuda_archs"] = FACTKERNELS_CUDA_ARCHS;
#endif
    info["cuda_devices"] = cuda::device_count();
    info["cuda_runtime_version"] = cuda::runtime_version();
    info["cuda_driver_version"] = cuda::driver_version();
#else
    info["cuda"] = false;
    info["cuda_devices"] = 0;
#endif
#ifdef FACTKERNELS_OPENMP
    info["openmp"] = true;
#else
    info["openmp"] = false;
#endif
    info["cpu_threads"] = cpu::num_threads();
#if defined(__clang__)
    info["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    info["compiler"] = std::string("gcc ") + __VERSION__;
#else
    info["compiler"] = std::string("unknown");
#endif
    return info;
  });
}
