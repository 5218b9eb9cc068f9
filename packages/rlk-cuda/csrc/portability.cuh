// Portability layer: the only place that knows whether we compile as CUDA or HIP.
// Kernels use these names so that rlk-rocm can build the same sources with hipcc.
#pragma once

#include <cstdint>

#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define RLK_HIP 1
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define RLK_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define RLK_WARP_SIZE 64
#endif
typedef hipStream_t rlkStream_t;
typedef hipError_t rlkError_t;
#define rlkSuccess hipSuccess
#define rlkGetLastError hipGetLastError
#define rlkGetErrorString hipGetErrorString
#define rlkSetDevice hipSetDevice
typedef uint64_t rlk_lanemask_t;
#define RLK_FULL_MASK (~0ull)
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define RLK_WARP_SIZE 32
typedef cudaStream_t rlkStream_t;
typedef cudaError_t rlkError_t;
#define rlkSuccess cudaSuccess
#define rlkGetLastError cudaGetLastError
#define rlkGetErrorString cudaGetErrorString
#define rlkSetDevice cudaSetDevice
typedef uint32_t rlk_lanemask_t;
#define RLK_FULL_MASK 0xffffffffu
#endif

// Launch bounds with a register budget: CUDA reads the second number as blocks per SM; HIP's
// second number means waves per execution unit instead, so the HIP build keeps the first only.
#if RLK_HIP
#define RLK_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define RLK_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

namespace rlk {

// Raw storage types, converted by the helpers in common.cuh so both toolchains agree bit for bit.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

// Butterfly exchange for any type both toolchains shuffle (float, int, double).
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
#if RLK_HIP
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(RLK_FULL_MASK, v, lane_mask);
#endif
}

__device__ __forceinline__ float shfl_up(float v, int delta) {
#if RLK_HIP
  return __shfl_up(v, delta);
#else
  return __shfl_up_sync(RLK_FULL_MASK, v, delta);
#endif
}

__device__ __forceinline__ int shfl_idx(int v, int lane) {
#if RLK_HIP
  return __shfl(v, lane);
#else
  return __shfl_sync(RLK_FULL_MASK, v, lane);
#endif
}

__device__ __forceinline__ rlk_lanemask_t ballot(bool p) {
#if RLK_HIP
  return __ballot(p);
#else
  return __ballot_sync(RLK_FULL_MASK, p);
#endif
}

__device__ __forceinline__ int popc(rlk_lanemask_t m) {
#if RLK_HIP
  return __popcll(m);
#else
  return __popc(m);
#endif
}

// max that returns NaN when either input is NaN (fmaxf drops NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
#if !RLK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
#endif
}

// 16-byte streaming load: logits are read once, so keep them out of the way of the cache.
#if RLK_HIP
// The nontemporal builtins take native vector types only; HIP's uint4 is a struct around one.
typedef unsigned int rlk_u32x4 __attribute__((ext_vector_type(4)));
#endif

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
#if RLK_HIP
  const rlk_u32x4 v = __builtin_nontemporal_load(reinterpret_cast<const rlk_u32x4*>(p));
  return make_uint4(v.x, v.y, v.z, v.w);
#else
  return __ldcs(p);
#endif
}

// 4- and 8-byte streaming loads, for the leading words of a vector (row_vectors.cuh).
__device__ __forceinline__ uint32_t load_stream(const uint32_t* p) {
#if RLK_HIP
  return __builtin_nontemporal_load(p);
#else
  return __ldcs(p);
#endif
}

__device__ __forceinline__ uint2 load_stream(const uint2* p) {
#if RLK_HIP
  typedef unsigned int rlk_u32x2 __attribute__((ext_vector_type(2)));
  const rlk_u32x2 v = __builtin_nontemporal_load(reinterpret_cast<const rlk_u32x2*>(p));
  return make_uint2(v.x, v.y);
#else
  return __ldcs(p);
#endif
}

__device__ __forceinline__ void store_stream(uint4* p, uint4 v) {
#if RLK_HIP
  const rlk_u32x4 w = {v.x, v.y, v.z, v.w};
  __builtin_nontemporal_store(w, reinterpret_cast<rlk_u32x4*>(p));
#else
  __stcs(p, v);
#endif
}

// Two floats to packed bf16x2 / f16x2 (round to nearest even, NaN kept). `lo` goes to the
// lower address. Hardware conversion on sm_80+, bit arithmetic elsewhere.
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if !RLK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return bf16_bits(lo) | (bf16_bits(hi) << 16);
#endif
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#if !RLK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
#endif
}

}  // namespace rlk
