// Device bookkeeping: which devices exist, which runtime and driver, which device is current.
#include <cuda_runtime.h>

#include "cuda/common.cuh"

namespace factkernels {
namespace cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver, a driver older than this runtime, or no device: report 0, leave no error
    return 0;
  }
  return n;
}

int runtime_version() { return CUDART_VERSION; }

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  cudaGetLastError();  // a destructor must not throw; a failed restore leaves no sticky error behind
}

int multiprocessor_count() {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

}  // namespace cuda
}  // namespace factkernels
