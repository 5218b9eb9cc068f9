// 16-byte vectors of a row that may start at any byte: every vector is read with one 16-byte
// load, whatever the row's alignment.
//
// A row that starts `mis` bytes past a 16-byte boundary `base` has its vector j in the aligned
// vectors base[j] and base[j + 1]. With consecutive vectors in consecutive lanes, base[j + 1]
// is the next lane's load: a shuffle brings it over (only the last lane of a warp loads its
// own), and a funnel shift cuts the vector out of the pair. The words the shift takes are
// fixed by mis / 4, a template argument (Q), so the pair never becomes an array indexed at
// run time (local memory); the bytes within a word are a run-time shift. The vectors come out
// with the same bytes in the same order as aligned rows', so whatever a kernel computes from
// them does not depend on where the row starts (batch invariance).
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

// Vectors j + u * STRIDE (u < U) of the row at `at`, all loads issued before the first use;
// with CHECKED only those below `end` (the others are left unset), else every one of them is
// (no predicates). Q is at.mis / 4 (kAligned when at.mis is 0). With Q >= 0 every lane of the
// warp must call this together, j consecutive across lanes; the last lane's second halves
// (the vectors past the warp's) are loaded by lanes 0..U-1, one each, so that they cost one
// register vector, not U. Vector `end` must lie in the row's allocation (a 16-byte block that
// holds a byte of the row does).
template <int U, int STRIDE, int Q, bool CHECKED>
__device__ __forceinline__ void load_vectors(uint4 (&r)[U], const GridPos& at, int64_t j,
                                             int64_t end) {
  static_assert(U <= RLK_WARP_SIZE, "one lane per second half");
  if constexpr (Q == kAligned) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (!CHECKED || j + u * STRIDE < end) r[u] = load_stream(at.base + j + u * STRIDE);
  } else {
    const int lane = threadIdx.x % RLK_WARP_SIZE;
    const uint32_t bits = (at.mis & 3u) * 8u;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = j + u * STRIDE;
      r[u] = !CHECKED || k <= end ? load_stream(at.base + k) : make_uint4(0u, 0u, 0u, 0u);
    }
    // lane u < U: the vector after slot u's last lane
    const int64_t past = j - lane + lane * STRIDE + RLK_WARP_SIZE;
    uint4 beyond = make_uint4(0u, 0u, 0u, 0u);
    if (lane < U && (!CHECKED || past <= end)) beyond = load_stream(at.base + past);
    const bool last = lane == RLK_WARP_SIZE - 1;
    // word w of the following vector: both shuffles run in every lane (none may diverge)
    auto follow = [&](uint32_t mine, uint32_t beyond_w, int u) {
      const uint32_t down = shfl_down(mine, 1), far = shfl_idx(beyond_w, u);
      return last ? far : down;
    };
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint4 b = make_uint4(follow(r[u].x, beyond.x, u),
                                 Q >= 1 ? follow(r[u].y, beyond.y, u) : 0u,
                                 Q >= 2 ? follow(r[u].z, beyond.z, u) : 0u,
                                 Q >= 3 ? follow(r[u].w, beyond.w, u) : 0u);
      r[u] = cut_vector<Q>(r[u], b, bits);
    }
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
