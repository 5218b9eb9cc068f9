// Element conversions, 16-byte vector (un)packing and block reductions shared by the kernels,
// and the launch-error check their host code shares.
#pragma once

#include <cmath>
#include <cstdint>

#include "portability.cuh"

namespace rlk {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
}
__device__ __forceinline__ float to_float(f16_t v) {
  // One hardware conversion on both toolchains (cvt.f32.f16 on CUDA, v_cvt_f32_f16 on AMD):
  // every half is exact in float, so both agree bit for bit (NaN payloads aside). Decoding
  // the bits by hand costs ~15 instructions per element, which makes float16 rows
  // compute-bound at half of bfloat16's bandwidth.
  return __half2float(__ushort_as_half(v.bits));
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
  return bf16_t{static_cast<uint16_t>(bf16_bits(f))};
}
template <> __device__ __forceinline__ f16_t from_float<f16_t>(float f) {
  return f16_t{__half_as_ushort(__float2half_rn(f))};
}

// 1 / T, capped at 2^126 (log2(e) times it stays finite): below T = 2^-126 the exact inverse
// overflows float32 and (x - max) * inf is NaN at a row's maxima, where any finite gap times
// 2^126 already leaves the maxima alone, as the exact inverse would. A NaN T stays NaN.
__device__ __forceinline__ float inverse_temperature(float t) {
  const float inv = 1.0f / t;
  return inv > 0x1p126f ? 0x1p126f : inv;
}

// Number of elements of T in one 16-byte vector.
template <typename T> struct VecWidth { static constexpr int value = 16 / sizeof(T); };

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[VecWidth<T>::value]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < VecWidth<T>::value; ++i) out[i] = to_float(e[i]);
}

// bfloat16 pairs by word: the low half shifted up, the high half masked in place (one
// instruction per element; converting element by element extracts each half first).
template <>
__device__ __forceinline__ void unpack<bf16_t>(const uint4& v, float (&out)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float (&in)[VecWidth<T>::value]) {
  uint4 v;
  T* e = reinterpret_cast<T*>(&v);
#pragma unroll
  for (int i = 0; i < VecWidth<T>::value; ++i) e[i] = from_float<T>(in[i]);
  return v;
}
template <>
__device__ __forceinline__ uint4 pack<bf16_t>(const float (&in)[8]) {
  return make_uint4(pack_bf16x2(in[0], in[1]), pack_bf16x2(in[2], in[3]),
                    pack_bf16x2(in[4], in[5]), pack_bf16x2(in[6], in[7]));
}
template <>
__device__ __forceinline__ uint4 pack<f16_t>(const float (&in)[8]) {
  return make_uint4(pack_f16x2(in[0], in[1]), pack_f16x2(in[2], in[3]),
                    pack_f16x2(in[4], in[5]), pack_f16x2(in[6], in[7]));
}

// W values stored as O at dst: one 16-byte store, or one 8-byte store when O is half the width
// of the type read (float32 logits, bf16/fp16 gradient).
template <typename O, int W>
__device__ __forceinline__ void store_grad(O* dst, const float (&x)[W]) {
  if constexpr (sizeof(O) * W == 16) {
    store_stream(reinterpret_cast<uint4*>(dst), pack<O>(x));
  } else {
    static_assert(sizeof(O) * W == 8, "a gradient vector is 8 or 16 bytes");
    O v[W];
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = from_float<O>(x[k]);
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
  }
}

// Elements before the first 16-byte boundary of a row (rows may start unaligned).
template <typename T>
__device__ __forceinline__ int64_t head_elems(const T* p, int64_t n) {
  uintptr_t mis = reinterpret_cast<uintptr_t>(p) & 15u;
  int64_t h = mis == 0 ? 0 : static_cast<int64_t>((16u - mis) / sizeof(T));
  if (mis % sizeof(T) != 0) h = n;  // element-misaligned pointer: no vector path
  return h < n ? h : n;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

struct MinOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return min(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmin(a, b); }
};

// Reduce over each aligned run of WIDTH lanes (default: the warp) with a butterfly in a fixed
// order; every lane gets its run's result.
template <int WIDTH = RLK_WARP_SIZE, typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  static_assert(WIDTH <= RLK_WARP_SIZE && (WIDTH & (WIDTH - 1)) == 0, "a power of 2 in a warp");
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  return v;
}

// Reduce over a block in a fixed order (deterministic, batch-invariant): a butterfly inside
// each warp, then the warps' results in warp order. `scratch` holds one T per warp. Every
// thread gets the result.
template <int THREADS, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, Op op) {
  constexpr int kWarps = THREADS / RLK_WARP_SIZE;
  v = warp_reduce(v, op);
  const int warp = threadIdx.x / RLK_WARP_SIZE, lane = threadIdx.x % RLK_WARP_SIZE;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  return r;
}

// block_reduce's sum over N values at once, in the same fixed order, with one pair of barriers
// for all of them. `scratch` holds N values per warp. Every thread gets the N sums in `v`.
template <int THREADS, int N, typename T>
__device__ __forceinline__ void block_sum_array(T (&v)[N], T* scratch) {
  constexpr int kWarps = THREADS / RLK_WARP_SIZE;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = warp_reduce(v[k], SumOp{});
  const int warp = threadIdx.x / RLK_WARP_SIZE, lane = threadIdx.x % RLK_WARP_SIZE;
  __syncthreads();
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) scratch[warp * N + k] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    T r = scratch[k];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r += scratch[w * N + k];
    v[k] = r;
  }
}

template <int THREADS, typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  return block_reduce<THREADS>(v, scratch, SumOp{});
}

template <int THREADS>
__device__ __forceinline__ int block_min_int(int v, int* scratch) {
  return block_reduce<THREADS>(v, scratch, MinOp{});
}

// The error of the last launch on this thread as a message, or nullptr.
inline const char* last_error() {
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

}  // namespace rlk
