// Scaling by factors that live on the device, for linear_policy_loss:
// - scale_by_device_factor: a tensor multiplied in place by one float32 factor, the upstream
//   gradient of the loss (the forward computed the input gradients at 1). Every thread reads
//   the factor and returns when it is exactly 1 (loss.backward()), so that case moves no data;
//   otherwise one pass of 16-byte vectors, each element float(x) * factor rounded once to the
//   tensor's dtype (torch's mul_ by a 0-d float32 tensor first rounds the factor to a bfloat16
//   or float16 tensor's dtype).
// - scale_rows: out[r, :] = src[r, :] * factor[r] in another dtype, zeros where factor[r] is 0
//   whatever the row holds (a masked row's hidden state may be NaN): the per-row gradient
//   factors applied to a block's hidden rows and to its grad_hidden GEMM output, one pass where
//   torch's broadcast multiply, where() and cast took four strided ones.
// Products keep float32's subnormals (the library builds with -ftz): a gradient that small
// is still what float64 rounds to.
#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;

// a * b rounded to nearest, subnormal results kept (mul.rn.f32 without .ftz on CUDA; HIP
// builds do not flush).
__device__ __forceinline__ float mul_keep_subnormals(float a, float b) {
#if RLK_HIP
  return a * b;
#else
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#endif
}

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
    for (int k = 0; k < W; ++k) x[k] = mul_keep_subnormals(x[k], f);
    vectors[i] = pack<T>(x);
  }
  for (int64_t i = whole * W + first; i < n; i += stride)
    data[i] = from_float<T>(mul_keep_subnormals(to_float(data[i]), f));
}

template <typename T>
void launch(const ScaleArgs& a, rlkStream_t s) {
  const int64_t vectors = (a.n + VecWidth<T>::value - 1) / VecWidth<T>::value;
  const int64_t wanted = (vectors + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  scale_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<T*>(a.data), a.n, a.factor);
}

// Eight elements from 16-byte aligned memory, as floats (two vectors of float32, one of 16-bit).
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    float lo[4], hi[4];
    unpack<float>(load_stream(reinterpret_cast<const uint4*>(p)), lo);
    unpack<float>(load_stream(reinterpret_cast<const uint4*>(p) + 1), hi);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = lo[k], v[k + 4] = hi[k];
  } else {
    unpack<T>(load_stream(reinterpret_cast<const uint4*>(p)), v);
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float lo[4] = {v[0], v[1], v[2], v[3]}, hi[4] = {v[4], v[5], v[6], v[7]};
    reinterpret_cast<uint4*>(p)[0] = pack<float>(lo);
    reinterpret_cast<uint4*>(p)[1] = pack<float>(hi);
  } else {
    *reinterpret_cast<uint4*>(p) = pack<T>(v);
  }
}

// Block r: row r. Vec: every row of both matrices starts on a 16-byte boundary, cols % 8 == 0.
template <typename I, typename O, bool Vec>
__global__ void __launch_bounds__(kThreads) scale_rows_kernel(ScaleRowsArgs a) {
  const int64_t r = blockIdx.x;
  const float f = a.factor[r];
  const I* in = static_cast<const I*>(a.src) + r * a.src_row_stride;
  O* out = static_cast<O*>(a.out) + r * a.out_row_stride;
  if constexpr (Vec) {
    for (int64_t j = int64_t(threadIdx.x) * 8; j < a.cols; j += kThreads * 8) {
      float v[8];
      if (f == 0.f) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = 0.f;
      } else {
        load8<I>(in + j, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_keep_subnormals(v[k], f);
      }
      store8<O>(out + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < a.cols; j += kThreads)
      out[j] = from_float<O>(f == 0.f ? 0.f : mul_keep_subnormals(to_float(in[j]), f));
  }
}

template <typename I, typename O>
void launch_rows(const ScaleRowsArgs& a, rlkStream_t s) {
  const auto aligned = [](const void* p, int64_t stride, int64_t size) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride * size) % 16 == 0;
  };
  const bool vec = a.cols % 8 == 0 && aligned(a.src, a.src_row_stride, sizeof(I)) &&
                   aligned(a.out, a.out_row_stride, sizeof(O));
  const unsigned blocks = static_cast<unsigned>(a.rows);
  if (vec) scale_rows_kernel<I, O, true><<<blocks, kThreads, 0, s>>>(a);
  else scale_rows_kernel<I, O, false><<<blocks, kThreads, 0, s>>>(a);
}

template <typename I>
bool launch_rows_from(const ScaleRowsArgs& a, rlkStream_t s) {
  switch (a.out_dtype) {
    case kF32: launch_rows<I, float>(a, s); return true;
    case kBF16: launch_rows<I, bf16_t>(a, s); return true;
    case kF16: launch_rows<I, f16_t>(a, s); return true;
    default: return false;
  }
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
  return last_error();
}

const char* scale_rows(const ScaleRowsArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return nullptr;
  if (a.rows > 0x7fffffffLL) return "scale_rows: too many rows for one launch";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  bool known = false;
  switch (a.src_dtype) {
    case kF32: known = launch_rows_from<float>(a, s); break;
    case kBF16: known = launch_rows_from<bf16_t>(a, s); break;
    case kF16: known = launch_rows_from<f16_t>(a, s); break;
    default: break;
  }
  if (!known) return "scale_rows: dtypes must be float32, bfloat16 or float16";
  return last_error();
}

}  // namespace rlk
