// Counter-based random numbers (Philox4x32-10) keyed by a row's seed, so a row's draw depends
// only on its seed and the token index, never on the batch.
#pragma once

#include "common.cuh"

namespace rlk {

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const uint32_t hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += kW0;
    k.y += kW1;
  }
  return c;
}

// The Philox key of the row seeded with `seed`.
__device__ __forceinline__ uint2 seed_key(uint64_t seed) {
  return make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Philox block `block` of the row seeded with `seed`: the random bits of its tokens
// 4 * block .. 4 * block + 3.
__device__ __forceinline__ uint4 philox_block(uint64_t seed, uint32_t block) {
  return philox4x32_10(make_uint4(block, 0u, 0x726c6b73u, 0u), seed_key(seed));
}

// Gumbel(0, 1) noise for token `idx` from its block's bits.
__device__ __forceinline__ float gumbel_of(const uint4& r, uint32_t idx) {
  const uint32_t sel = idx & 3u;
  const uint32_t bits = sel == 0 ? r.x : sel == 1 ? r.y : sel == 2 ? r.z : r.w;
  const float u = (static_cast<float>(bits >> 8) + 0.5f) * 5.9604644775390625e-08f;  // (0, 1)
  return -logf(-logf(u));
}

// Gumbel(0, 1) noise for token `idx` of the row seeded with `seed`.
__device__ __forceinline__ float gumbel_noise(uint64_t seed, uint32_t idx) {
  return gumbel_of(philox_block(seed, idx >> 2), idx);
}

// A uniform in [0, 1) with 53 random bits from the row's seed alone, for the plain draw's
// inverse CDF: Philox on a counter no token's noise uses (second word 1).
__device__ __forceinline__ double row_uniform(uint64_t seed) {
  const uint4 r = philox4x32_10(make_uint4(0u, 1u, 0x726c6b73u, 0u), seed_key(seed));
  const uint64_t bits = (static_cast<uint64_t>(r.x >> 11) << 32) | r.y;
  return static_cast<double>(bits) * 1.1102230246251565e-16;  // 2^-53
}

// gumbel_noise for a thread that visits a row's tokens in increasing runs (a vector's
// elements): one Philox block serves four neighbouring tokens instead of one, the same bits.
struct GumbelRun {
  uint64_t seed;
  uint32_t block;  // the block `bits` holds; none at first (idx < 2^31 never reaches it)
  uint4 bits;

  __device__ __forceinline__ explicit GumbelRun(uint64_t s)
      : seed(s), block(0xffffffffu), bits(make_uint4(0u, 0u, 0u, 0u)) {}

  __device__ __forceinline__ float operator()(uint32_t idx) {
    if (idx >> 2 != block) {
      block = idx >> 2;
      bits = philox_block(seed, block);
    }
    return gumbel_of(bits, idx);
  }
};

}  // namespace rlk
