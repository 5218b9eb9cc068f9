// A tensor multiplied in place by a float32 factor that lives on the device: the backward of
// linear_policy_loss, whose forward computed the input gradients at upstream gradient 1, scales
// them by the loss's upstream gradient without reading it on the host. Every thread reads the
// factor and returns when it is exactly 1 (loss.backward()), so that case moves no data;
// otherwise one pass of 16-byte vectors, each element float(x) * factor rounded once to the
// tensor's dtype (torch's mul_ by a 0-d float32 tensor first rounds the factor to a bfloat16 or
// float16 tensor's dtype; products below float32's normal range flush to zero here).
#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // a grid-stride loop: enough blocks to fill any GPU

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(T* data, int64_t n, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  constexpr int W = VecWidth<T>::value;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  uint4* vectors = reinterpret_cast<uint4*>(data);
  const int64_t whole = n / W;
  for (int64_t i = first; i < whole; i += stride) {
    float x[W];
    unpack<T>(vectors[i], x);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] *= f;
    vectors[i] = pack<T>(x);
  }
  for (int64_t i = whole * W + first; i < n; i += stride)
    data[i] = from_float<T>(to_float(data[i]) * f);
}

template <typename T>
void launch(const ScaleArgs& a, rlkStream_t s) {
  const int64_t vectors = (a.n + VecWidth<T>::value - 1) / VecWidth<T>::value;
  const int64_t wanted = (vectors + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  scale_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<T*>(a.data), a.n, a.factor);
}

}  // namespace

const char* scale_by_device_factor(const ScaleArgs& a, void* stream) {
  if (a.n == 0) return nullptr;
  if (reinterpret_cast<uintptr_t>(a.data) % 16 != 0)
    return "scale_by_device_factor: data must start on a 16-byte boundary";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  switch (a.dtype) {
    case kF32: launch<float>(a, s); break;
    case kBF16: launch<bf16_t>(a, s); break;
    case kF16: launch<f16_t>(a, s); break;
    default: return "scale_by_device_factor: dtype must be float32, bfloat16 or float16";
  }
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

}  // namespace rlk
