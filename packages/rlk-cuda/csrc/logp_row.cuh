// One-pass online softmax statistics of a row, shared by logp forward and the sampler so that
// both compute bit-identical row maxima, sums and log-probabilities.
#pragma once

#include <cfloat>

#include "common.cuh"
#include "row_vectors.cuh"

namespace rlk {

// Running statistics in log2 units relative to the row max m (raw logit units), with
// v_i = (x_i - m) * invT * log2(e): s = sum 2^v_i - 1, the sum without one element equal to
// the max (its 2^0 = 1 is implicit), and w = sum 2^v_i * v_i. Leaving the 1 out keeps s exact
// to float32's relative precision when one token dominates (s << 1): 1 + s would round away
// what the backward's 1 - p and the token's logp need. Empty (m = -inf) means s = w = 0.
struct RowAcc {
  float m, s, w;
};

// Folds `p` (its implicit 1 made explicit unless `keep_one`) into `r`, whose max is r.m.
template <bool ENT>
__device__ __forceinline__ void acc_fold(RowAcc& r, const RowAcc& p, float sc, bool keep_one) {
  if (keep_one) {  // p's max is r's and p's implicit 1 becomes r's
    r.s += p.s;
    if (ENT) r.w += p.w;
    return;
  }
  const float d = (p.m - r.m) * sc, f = exp2f(d);
  const float full = p.s + 1.f;
  r.s = fmaf(full, f, r.s);
  // f * d, not d alone: at a tiny temperature d is -inf and f is 0, and p's share of the
  // entropy sum must vanish (0), not become 0 * -inf = NaN
  if (ENT) r.w = fmaf(f * fmaxf(d, -FLT_MAX), full, fmaf(f, p.w, r.w));
}

template <bool ENT, int N>
__device__ __forceinline__ void acc_chunk(RowAcc& a, const float (&x)[N], float sc) {
  float cm = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) cm = max_nan(cm, x[i]);
  const float mn = max_nan(a.m, cm);
  if (mn == -INFINITY) return;  // only -inf so far: nothing contributes
  bool one = mn == a.m;         // whether an earlier element already is the implicit 1
  if (!one) {                   // the max moved (or became NaN): rescale what we have
    const RowAcc old = a;
    a = RowAcc{mn, 0.f, 0.f};
    if (old.m != -INFINITY) acc_fold<ENT>(a, old, sc, false);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float v = (x[i] - mn) * sc;
    // the first element at the new max is the implicit 1: it adds nothing (a select, not a
    // branch, so the unrolled loop stays straight-line)
    const bool implicit_one = !one && v == 0.f;
    one = one || implicit_one;
    const float e = implicit_one ? 0.f : exp2f(v);
    a.s += e;
    if (ENT) a.w = fmaf(e, fmaxf(v, -FLT_MAX), a.w);
  }
}

template <bool ENT>
__device__ __forceinline__ RowAcc acc_combine(const RowAcc& a, const RowAcc& b, float sc) {
  const float mn = max_nan(a.m, b.m);
  if (mn == -INFINITY) return a;
  RowAcc r{mn, 0.f, 0.f};
  bool one = false;  // whether r's implicit 1 is taken
  auto fold = [&](const RowAcc& p) {
    if (p.m == -INFINITY) return;
    const bool keep = !one && p.m == mn;
    one = one || keep;
    acc_fold<ENT>(r, p, sc, keep);
  };
  fold(a);
  fold(b);
  return r;
}

// log of the row's shifted sum, log(1 + s), for a row with a finite max.
__device__ __forceinline__ float row_log_sum(const RowAcc& r) { return log1pf(r.s); }

// Entropy of the row's softmax in nats from its statistics and row_log_sum.
__device__ __forceinline__ float row_entropy(const RowAcc& r, float log_s) {
  return log_s - kLn2 * (r.w / (1.f + r.s));
}

// Block-wide reduction in a fixed order; the result is valid in thread 0.
template <bool ENT, int THREADS>
__device__ __forceinline__ RowAcc acc_block_reduce(RowAcc a, float sc) {
  constexpr int kWarps = THREADS / RLK_WARP_SIZE;
  __shared__ RowAcc part[kWarps];
#pragma unroll
  for (int o = RLK_WARP_SIZE / 2; o > 0; o >>= 1) {
    RowAcc b{shfl_xor(a.m, o), shfl_xor(a.s, o), ENT ? shfl_xor(a.w, o) : 0.f};
    a = acc_combine<ENT>(a, b, sc);
  }
  const int warp = threadIdx.x / RLK_WARP_SIZE, lane = threadIdx.x % RLK_WARP_SIZE;
  if (lane == 0) part[warp] = a;
  __syncthreads();
  RowAcc r = part[0];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = acc_combine<ENT>(r, part[w], sc);
  }
  return r;
}

// W consecutive elements starting at logical vector j: one 16-byte load when the row is
// aligned, W scalar loads otherwise (the bulk-copy forward's and the sampler's unaligned rows).
// Either way the values and their order are the same.
template <typename T, bool ALIGNED>
__device__ __forceinline__ void load_vec(const T* p, int64_t j, float (&x)[VecWidth<T>::value]) {
  constexpr int W = VecWidth<T>::value;
  if (ALIGNED) {
    unpack<T>(load_stream(reinterpret_cast<const uint4*>(p) + j), x);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = to_float(p[j * W + k]);
  }
}

template <typename T>
__device__ __forceinline__ bool is_aligned16(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The vector loop of row_stats_range for one word shift Q (row_vectors.cuh). Thread t takes
// vectors t, t + THREADS, ... in chunks of UNROLL (one acc_chunk each), then the row's last
// ones (fewer than UNROLL) one at a time, their loads in flight together: the order, and so
// every bit of the result, depends on V and the launch shape only, not on where the row
// starts.
template <typename T, int THREADS, int UNROLL, bool ENT, int Q>
__device__ __forceinline__ void row_stats_loop(RowAcc& a, const GridPos& at, float sc,
                                               int64_t v_begin, int64_t v_end) {
  constexpr int W = VecWidth<T>::value;
  int64_t j = v_begin + threadIdx.x;
  for (; j + (UNROLL - 1) * THREADS < v_end; j += UNROLL * THREADS) {
    uint4 r[UNROLL];
    load_vectors<UNROLL, THREADS, Q, false>(r, at, j, v_end);
    float x[UNROLL * W];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float y[W];
      unpack<T>(r[u], y);
#pragma unroll
      for (int k = 0; k < W; ++k) x[u * W + k] = y[k];
    }
    acc_chunk<ENT>(a, x, sc);
  }
  if (j < v_end) {
    uint4 r[UNROLL];
    load_vectors<UNROLL, THREADS, Q, true>(r, at, j, v_end);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (j + u * THREADS < v_end) {
        float y[W];
        unpack<T>(r[u], y);
        acc_chunk<ENT>(a, y, sc);
      }
    }
  }
}

// Statistics of the logical vectors [v_begin, v_end) of a row of V elements starting at p
// (unit stride), UNROLL vectors in flight per thread; the scalar tail (V % W elements) is
// included when asked. ANY: the row may start at any byte, else on a 16-byte boundary (the
// caller knows; rows_aligned). The result is valid in thread 0.
template <typename T, int THREADS, int UNROLL, bool ENT, bool ANY>
__device__ __forceinline__ RowAcc row_stats_range(const T* p, int64_t V, float sc,
                                                  int64_t v_begin, int64_t v_end, bool tail) {
  constexpr int W = VecWidth<T>::value;
  RowAcc a{-INFINITY, 0.f, 0.f};
  const int64_t nv = V / W;
  if (v_end > nv) v_end = nv;
  const GridPos at = grid_pos(p);
  if constexpr (ANY) {
    with_shift(at.mis, [&](auto shift) {
      row_stats_loop<T, THREADS, UNROLL, ENT, decltype(shift)::value>(a, at, sc, v_begin, v_end);
    });
  } else {
    row_stats_loop<T, THREADS, UNROLL, ENT, kAligned>(a, at, sc, v_begin, v_end);
  }
  const int64_t t = nv * W + threadIdx.x;
  if (tail && t < V) {
    const float x[1] = {to_float(p[t])};
    acc_chunk<ENT>(a, x, sc);
  }
  return acc_block_reduce<ENT, THREADS>(a, sc);
}

// The split forward (rows of V >= 65536, logp.cu): block (row, seg) of kSplitThreads threads
// reduces the row's vectors [seg * per, (seg + 1) * per), kSplitUnroll in flight per thread,
// the last segment also the scalar tail. per depends on V only (batch invariance); the sampler
// reads the same segments back (sample.cu).
constexpr int kSplitThreads = 256, kSplitUnroll = 4;

__host__ __device__ __forceinline__ int64_t split_segment_vectors(int64_t nv, int nseg) {
  constexpr int64_t step = static_cast<int64_t>(kSplitUnroll) * kSplitThreads;
  return ((nv + nseg - 1) / nseg + step - 1) / step * step;
}

template <typename T, int THREADS, int UNROLL, bool ENT, bool ANY>
__device__ __forceinline__ RowAcc row_stats(const T* p, int64_t V, float sc) {
  return row_stats_range<T, THREADS, UNROLL, ENT, ANY>(p, V, sc, 0, V, true);
}

// log p(token) from the statistics; written with explicit roundings so that every kernel that
// calls it (logp forward, sampler) produces the same bits.
__device__ __forceinline__ float logp_from_stats(float raw_tok, float m, float inv_t, float log_s) {
  return __fsub_rn(__fmul_rn(__fsub_rn(raw_tok, m), inv_t), log_s);
}

}  // namespace rlk
