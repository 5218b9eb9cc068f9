// 16-byte vectors of a row that may start at any byte: every vector is read with 16-byte
// loads, whatever the row's alignment.
//
// A row that starts `mis` bytes past a 16-byte boundary `base` has its vector j in the aligned
// vectors base[j] and base[j + 1]: a thread loads both (the second is its neighbour's first,
// so it comes from L1 or L2, not from memory again) and a funnel shift cuts the vector out of
// the pair. The words the shift takes are fixed by mis / 4, a template argument (Q), so the
// pair never becomes an array indexed at run time (local memory); the bytes within a word
// are a run-time shift. The vectors come out with the same bytes in the same order as aligned
// rows', so whatever a kernel computes from them does not depend on where the row starts
// (batch invariance). A first version took base[j + 1] from the next lane by a shuffle (the
// last lane's from lanes 0..3): its shuffles and selects cost more issue slots than a second
// load, and bfloat16 rows read at 62-77% of the copy bandwidth (H200, 2026-12-04).
#pragma once

#include "common.cuh"

namespace rlk {

// Aligned rows: Q = kAligned, no shuffle.
constexpr int kAligned = -1;

// Where a pointer sits on the 16-byte grid: the boundary at or below it and the bytes past it.
struct GridPos {
  const uint4* base;
  uint32_t mis;
};

__device__ __forceinline__ GridPos grid_pos(const void* p) {
  const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 15u);
  return GridPos{reinterpret_cast<const uint4*>(static_cast<const char*>(p) - mis), mis};
}

// The low word of (hi:lo) >> bits, bits < 32.
__device__ __forceinline__ uint32_t funnel_right(uint32_t lo, uint32_t hi, uint32_t bits) {
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> bits);
}

// The 16 bytes starting 4 * Q + bits / 8 bytes into the pair (a, b); reads b's words 0..Q.
template <int Q>
__device__ __forceinline__ uint4 cut_vector(const uint4& a, const uint4& b, uint32_t bits) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  return make_uint4(funnel_right(w[Q], w[Q + 1], bits), funnel_right(w[Q + 1], w[Q + 2], bits),
                    funnel_right(w[Q + 2], w[Q + 3], bits), funnel_right(w[Q + 3], w[Q + 4], bits));
}

// Words 0..Q of the aligned vector at p: all a cut of shift Q reads of a vector's second half.
template <int Q>
__device__ __forceinline__ uint4 load_head(const uint4* p) {
  if constexpr (Q == 0) {
    return make_uint4(load_stream(reinterpret_cast<const uint32_t*>(p)), 0u, 0u, 0u);
  } else if constexpr (Q == 1) {
    const uint2 h = load_stream(reinterpret_cast<const uint2*>(p));
    return make_uint4(h.x, h.y, 0u, 0u);
  } else {
    return load_stream(p);
  }
}

// Vectors j + u * STRIDE (u < U) of the row at `at`, all loads issued before the first use;
// with CHECKED only those below `end` (the others are left unset), else every one of them is
// (no predicates). Q is at.mis / 4 (kAligned when at.mis is 0). Vector `end` must lie in the
// row's allocation when Q >= 0 (a 16-byte block that holds a byte of the row does).
template <int U, int STRIDE, int Q, bool CHECKED>
__device__ __forceinline__ void load_vectors(uint4 (&r)[U], const GridPos& at, int64_t j,
                                             int64_t end) {
  if constexpr (Q == kAligned) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (!CHECKED || j + u * STRIDE < end) r[u] = load_stream(at.base + j + u * STRIDE);
  } else {
    uint4 second[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = j + u * STRIDE;
      if (!CHECKED || k < end) {
        r[u] = load_stream(at.base + k);
        second[u] = load_head<Q>(at.base + k + 1);
      }
    }
    const uint32_t bits = (at.mis & 3u) * 8u;
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = cut_vector<Q>(r[u], second[u], bits);
  }
}

// The word shift Q as a type, so that a generic lambda can take it as a template argument.
template <int Q>
struct Shift {
  static constexpr int value = Q;
};

// Calls f(Shift<Q>{}) with Q = mis / 4, or Shift<kAligned> when mis is 0: one branch per row,
// outside the kernels' loops.
template <typename F>
__device__ __forceinline__ void with_shift(uint32_t mis, F&& f) {
  if (mis == 0) return f(Shift<kAligned>{});
  switch (mis >> 2) {
    case 0: return f(Shift<0>{});
    case 1: return f(Shift<1>{});
    case 2: return f(Shift<2>{});
    default: return f(Shift<3>{});
  }
}

// Whether every row of `rows` rows `row_stride` elements of `elem` bytes apart, the first at
// `p`, starts on a 16-byte boundary (host side: picks the kernels without the shifts).
inline bool rows_aligned(const void* p, int64_t rows, int64_t row_stride, int64_t elem) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (rows <= 1 || row_stride * elem % 16 == 0);
}

}  // namespace rlk
