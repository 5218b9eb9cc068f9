// Sampling with temperature, top-k, top-p and min-p, one block per row.
//
// With d = (max - x) / T >= 0, every filter keeps a prefix {d <= tau} of the sorted row. The
// kernel narrows tau with counting passes (7 pivots per pass, counts and masses in registers,
// no atomics), and as soon as every possible survivor fits in shared memory it gathers them,
// sorts them and finishes exactly there. Only degenerate rows (huge ties, huge nuclei) keep
// narrowing until tau is exact and then draw in one more pass. The draw is Gumbel-max with
// Philox noise keyed by (seed, token index), so both routes pick the same token. With a
// temperature and no filter the draw is an inverse CDF instead (plain_draw): one uniform per
// row, so the row is read at memory speed rather than paying Philox for every token; where the
// statistics pass split the row, only the segment holding the draw is read (pick_segment).
#include <cfloat>
#include <climits>

#include "logp_row.cuh"
#include "philox.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 1024;
constexpr int kCap = 2048;
constexpr int kPivots = 8;  // the last one is the current upper bound

// Visits every element of a row as f(index, value), thread by thread in an order that does not
// depend on the row's alignment (see load_vec), two vectors in flight per thread.
template <typename T, bool ALIGNED, typename F>
__device__ __forceinline__ void for_each_vec(const T* p, int64_t nv, F& f) {
  constexpr int W = VecWidth<T>::value;
  int64_t j = threadIdx.x;
  for (; j + kThreads < nv; j += 2 * kThreads) {
    float x0[W], x1[W];
    load_vec<T, ALIGNED>(p, j, x0);
    load_vec<T, ALIGNED>(p, j + kThreads, x1);
#pragma unroll
    for (int k = 0; k < W; ++k) f(j * W + k, x0[k]);
#pragma unroll
    for (int k = 0; k < W; ++k) f((j + kThreads) * W + k, x1[k]);
  }
  for (; j < nv; j += kThreads) {
    float x[W];
    load_vec<T, ALIGNED>(p, j, x);
#pragma unroll
    for (int k = 0; k < W; ++k) f(j * W + k, x[k]);
  }
}

template <typename T, typename F>
__device__ __forceinline__ void for_each_elem(const T* p, int64_t V, F&& f) {
  constexpr int W = VecWidth<T>::value;
  const int64_t nv = V / W;
  if (is_aligned16(p)) for_each_vec<T, true>(p, nv, f);
  else for_each_vec<T, false>(p, nv, f);
  const int64_t t = nv * W + threadIdx.x;
  if (t < V) f(t, to_float(p[t]));
}

__device__ __forceinline__ float mass_of(float d) { return exp2f(-d * kLog2e); }

struct Shared {
  unsigned long long cand[kCap];
  float cum[kCap];
  float pivots[kPivots];
  float fred[kThreads / RLK_WARP_SIZE];
  int ired[kThreads / RLK_WARP_SIZE];
  int count;
};

// Counts (and masses) of elements with d <= pivot for every pivot in sh.pivots.
template <typename T, bool MASS>
__device__ void count_pass(const T* p, int64_t V, float m, float inv_t, Shared& sh,
                           int (&cnt)[kPivots], float (&ms)[kPivots]) {
  float pv[kPivots];
#pragma unroll
  for (int j = 0; j < kPivots; ++j) { pv[j] = sh.pivots[j]; cnt[j] = 0; ms[j] = 0.f; }
  for_each_elem(p, V, [&](int64_t, float x) {
    const float d = (m - x) * inv_t;
    const float e = MASS ? mass_of(d) : 0.f;
#pragma unroll
    for (int j = 0; j < kPivots; ++j) {
      const bool in = d <= pv[j];
      cnt[j] += in;
      if (MASS) ms[j] += in ? e : 0.f;
    }
  });
#pragma unroll
  for (int j = 0; j < kPivots; ++j) {
    cnt[j] = block_sum<kThreads>(cnt[j], sh.ired);
    if (MASS) ms[j] = block_sum<kThreads>(ms[j], sh.fred);
  }
}

// Chooses pivots strictly inside (lo, hi], hi last. lo < 0 means "below every element".
__device__ void set_pivots(Shared& sh, float lo, float hi) {
  if (threadIdx.x != 0) return;
  if (lo < 0.f && hi == INFINITY) {
    const float first[kPivots - 1] = {0.5f, 1.f, 2.f, 4.f, 8.f, 16.f, 32.f};
    for (int j = 0; j < kPivots - 1; ++j) sh.pivots[j] = first[j];
  } else if (lo < 0.f) {  // geometric towards 0, so that ties at the max converge
    const float f[kPivots - 1] = {0.f, 1.f / 4096, 1.f / 512, 1.f / 64, 1.f / 16, 0.25f, 0.5f};
    for (int j = 0; j < kPivots - 1; ++j) sh.pivots[j] = hi * f[j];
  } else {
    const int64_t klo = lo < 0.f ? -1 : static_cast<int64_t>(__float_as_uint(lo));
    const int64_t khi = static_cast<int64_t>(__float_as_uint(hi));
    for (int j = 0; j < kPivots - 1; ++j) {
      int64_t k = klo + ((khi - klo) * (j + 1)) / kPivots;
      if (k <= klo) k = klo + 1;
      if (k > khi) k = khi;
      sh.pivots[j] = __uint_as_float(static_cast<uint32_t>(k));
    }
  }
  sh.pivots[kPivots - 1] = hi;
}

// Makes v one of the pivots when it lies strictly inside (lo, hi): it takes the place of the
// first pivot at or above it (never hi's), which keeps the pivots in order.
__device__ void insert_pivot(Shared& sh, float lo, float hi, float v) {
  if (threadIdx.x != 0 || !(v > lo && v < hi)) return;
  int j = 0;
  while (j < kPivots - 2 && sh.pivots[j] < v) ++j;
  sh.pivots[j] = v;
}

__device__ __forceinline__ bool converged(float lo, float hi) {
  if (lo < 0.f) return hi == 0.f;
  return __float_as_uint(hi) - __float_as_uint(lo) <= 1u;
}

// Block-wide inclusive scan into sh.cum of the values a0, a1 of entries 2t, 2t + 1 (thread t),
// in a fixed order.
__device__ void scan_pairs(Shared& sh, float a0, float a1) {
  const int t = threadIdx.x, lane = t % RLK_WARP_SIZE, warp = t / RLK_WARP_SIZE;
  const int i0 = 2 * t, i1 = 2 * t + 1;
  float v = a0 + a1;
#pragma unroll
  for (int o = 1; o < RLK_WARP_SIZE; o <<= 1) {
    const float u = shfl_up(v, o);
    if (lane >= o) v += u;
  }
  __syncthreads();
  if (lane == RLK_WARP_SIZE - 1) sh.fred[warp] = v;
  __syncthreads();
  if (t == 0) {
    float run = 0.f;
    for (int w = 0; w < kThreads / RLK_WARP_SIZE; ++w) {
      const float x = sh.fred[w];
      sh.fred[w] = run;
      run += x;
    }
  }
  __syncthreads();
  const float excl = sh.fred[warp] + v - (a0 + a1);
  if (i0 < kCap) sh.cum[i0] = excl + a0;
  if (i1 < kCap) sh.cum[i1] = excl + a0 + a1;
  __syncthreads();
}

__device__ __forceinline__ uint32_t cand_key(const Shared& sh, int i) {
  return static_cast<uint32_t>(sh.cand[i] >> 32);
}

// Inclusive scan of the n gathered candidates' masses into sh.cum.
__device__ void scan_masses(Shared& sh, int n) {
  const int i0 = 2 * threadIdx.x, i1 = i0 + 1;
  scan_pairs(sh, i0 < n ? mass_of(__uint_as_float(cand_key(sh, i0))) : 0.f,
             i1 < n ? mass_of(__uint_as_float(cand_key(sh, i1))) : 0.f);
}

// One past the last candidate whose key equals candidate i's (ties stay together).
__device__ int end_of_ties(Shared& sh, int i, int n) {
  const uint32_t key = cand_key(sh, i);
  int best = n;
  for (int j = threadIdx.x; j < n; j += kThreads)
    if (j > i && cand_key(sh, j) != key) best = min(best, j);
  return block_min_int<kThreads>(best, sh.ired);
}

// Gumbel-max over (score, index): largest score wins, ties go to the smaller index.
struct Pick {
  float score;
  int idx;
};
__device__ __forceinline__ Pick better(Pick a, Pick b) {
  if (b.score > a.score || (b.score == a.score && b.idx < a.idx)) return b;
  return a;
}
__device__ Pick block_argmax(Pick a, Shared& sh) {
#pragma unroll
  for (int o = RLK_WARP_SIZE / 2; o > 0; o >>= 1) {
    Pick b{shfl_xor(a.score, o), shfl_xor(a.idx, o)};
    a = better(a, b);
  }
  const int lane = threadIdx.x % RLK_WARP_SIZE, warp = threadIdx.x / RLK_WARP_SIZE;
  __syncthreads();
  if (lane == 0) { sh.fred[warp] = a.score; sh.ired[warp] = a.idx; }
  __syncthreads();
  Pick r{sh.fred[0], sh.ired[0]};
  for (int w = 1; w < kThreads / RLK_WARP_SIZE; ++w) r = better(r, Pick{sh.fred[w], sh.ired[w]});
  return r;
}

// The plain draw (a temperature, no filter): the inverse CDF of the row's masses in index order
// at u * total, u = row_uniform(seed). Pass one sums the masses of each group of
// RLK_WARP_SIZE consecutive vectors into sh.cum; the scan of the groups finds the group
// holding u * total, and one warp walks it. The total is the sum of the group sums, so a
// zero mass never takes the draw (rounding inside the walk falls back to the group's last
// positive mass). Whole rows of more than kCap groups (V > 262144 in float32 on CUDA, which
// only the bulk-copy forward's statistics leave unsplit) take the Gumbel-max pass.
template <typename T>
__device__ __forceinline__ int64_t plain_groups(int64_t V) {
  const int64_t nv = V / VecWidth<T>::value;
  return (nv + RLK_WARP_SIZE - 1) / RLK_WARP_SIZE + (nv * VecWidth<T>::value < V ? 1 : 0);
}

// A logit's mass relative to the row maximum m; the sums and the walk use this one expression,
// so they agree on every element.
__device__ __forceinline__ float mass_at(float x, float m, float inv_t) {
  return mass_of((m - x) * inv_t);
}

template <typename T>
__device__ __forceinline__ float vector_mass(const float (&x)[VecWidth<T>::value], float m,
                                             float inv_t) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VecWidth<T>::value; ++k) s += mass_at(x[k], m, inv_t);
  return s;
}

// Group sums into sh.cum[0 .. groups), the scalar tail's (V % W elements) after them.
template <typename T, bool ALIGNED>
__device__ void group_masses(const T* p, int64_t V, float m, float inv_t, Shared& sh) {
  constexpr int W = VecWidth<T>::value;
  const int64_t nv = V / W;
  const int lane = threadIdx.x % RLK_WARP_SIZE;
  for (int64_t base = threadIdx.x - lane; base < nv; base += 2 * kThreads) {  // warp-uniform
    const int64_t j0 = base + lane, j1 = j0 + kThreads;
    float x0[W], x1[W];
    if (j0 < nv) load_vec<T, ALIGNED>(p, j0, x0);
    if (j1 < nv) load_vec<T, ALIGNED>(p, j1, x1);
    const float s0 = warp_reduce(j0 < nv ? vector_mass<T>(x0, m, inv_t) : 0.f, SumOp{});
    const float s1 = warp_reduce(j1 < nv ? vector_mass<T>(x1, m, inv_t) : 0.f, SumOp{});
    if (lane == 0) {
      sh.cum[base / RLK_WARP_SIZE] = s0;
      if (base + kThreads < nv) sh.cum[(base + kThreads) / RLK_WARP_SIZE] = s1;
    }
  }
  if (threadIdx.x == 0 && nv * W < V) {
    float s = 0.f;
    for (int64_t t = nv * W; t < V; ++t) s += mass_at(to_float(p[t]), m, inv_t);
    sh.cum[(nv + RLK_WARP_SIZE - 1) / RLK_WARP_SIZE] = s;
  }
}

// Group g's token at `rest` (0 <= rest < its mass, up to rounding): warp 0 sums each lane's
// vector, finds the lane by a scan, and that lane walks its elements. Returns the token in
// every thread of warp 0.
template <typename T, bool ALIGNED>
__device__ int walk_group(const T* p, int64_t V, int64_t g, double rest, float m, float inv_t) {
  constexpr int W = VecWidth<T>::value;
  const int64_t nv = V / W;
  const int lane = threadIdx.x % RLK_WARP_SIZE;
  if (g * RLK_WARP_SIZE >= nv) {  // the scalar tail: one thread walks it
    int last = -1, tok = -1;
    double acc = 0.0;
    for (int64_t t = nv * W; t < V && tok < 0; ++t) {
      const float e = mass_at(to_float(p[t]), m, inv_t);
      acc += e;
      if (e > 0.f) last = static_cast<int>(t);
      if (e > 0.f && rest < acc) tok = static_cast<int>(t);
    }
    return tok >= 0 ? tok : last;
  }
  const int64_t j = g * RLK_WARP_SIZE + lane;
  float x[W];
  float s = 0.f;
  if (j < nv) {
    load_vec<T, ALIGNED>(p, j, x);
    s = vector_mass<T>(x, m, inv_t);
  }
  float incl = s;
#pragma unroll
  for (int o = 1; o < RLK_WARP_SIZE; o <<= 1) {
    const float u = shfl_up(incl, o);
    if (lane >= o) incl += u;
  }
  // the first lane whose prefix passes `rest`, else the last lane with any mass
  const int mine = s > 0.f && rest < static_cast<double>(incl) ? lane : RLK_WARP_SIZE;
  int lane_at = warp_reduce(mine, MinOp{});
  if (lane_at == RLK_WARP_SIZE) lane_at = -warp_reduce(s > 0.f ? -lane : 1, MinOp{});
  int tok = -1;
  if (lane == lane_at) {
    double acc = static_cast<double>(incl) - s;
    int last = -1;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float e = mass_at(x[k], m, inv_t);
      acc += e;
      if (e > 0.f) last = k;
      if (tok < 0 && e > 0.f && rest < acc) tok = k;
    }
    tok = static_cast<int>(j * W + (tok >= 0 ? tok : last));
  }
  return warp_reduce(lane == lane_at ? tok : INT_MAX, MinOp{});
}

// The plain draw of the V elements at p at the uniform u: the token (in warp 0) and the total
// mass.
template <typename T, bool ALIGNED>
__device__ Pick plain_draw(const T* p, int64_t V, float m, float inv_t, double u, Shared& sh,
                           float& total) {
  const int groups = static_cast<int>(plain_groups<T>(V));
  group_masses<T, ALIGNED>(p, V, m, inv_t, sh);
  __syncthreads();
  const int i0 = 2 * threadIdx.x, i1 = i0 + 1;
  scan_pairs(sh, i0 < groups ? sh.cum[i0] : 0.f, i1 < groups ? sh.cum[i1] : 0.f);
  total = sh.cum[groups - 1];
  const double target = u * static_cast<double>(total);
  int first = groups;  // the first group whose inclusive sum passes the target
  for (int i = threadIdx.x; i < groups; i += kThreads)
    if (target < static_cast<double>(sh.cum[i])) first = min(first, i);
  first = min(block_min_int<kThreads>(first, sh.ired), groups - 1);  // min: never reached
  Pick pick{0.f, 0};
  if (threadIdx.x < RLK_WARP_SIZE) {
    const double before = first > 0 ? static_cast<double>(sh.cum[first - 1]) : 0.0;
    pick.idx = walk_group<T, ALIGNED>(p, V, first, target - before, m, inv_t);
  }
  return pick;
}

// The plain draw after a split statistics pass (the generic forward, nseg > 1) reads one
// segment instead of the row: the segment holding u * total is found from the pass's partial
// statistics (per segment its largest logit and the sum of exp2((x - largest) * sc) less the
// largest's own 1, logp_row.cuh's RowAcc), then the inverse CDF inside that segment is taken at
// the remainder, rescaled to the segment's mass.
// A segment whose mass is below 2^-100 of the row's largest logit's (the total is at least 1)
// is never drawn, so the one drawn holds an element of normal float mass and its own sums are
// positive; that moves the law by less than nseg * 2^-100.
struct Segment {
  int64_t begin, end;  // its elements
  double u;            // the uniform of the draw inside it
  float total;         // the row's mass relative to its largest logit
};

__device__ __forceinline__ double segment_mass(const float* part, float m, float sc) {
  const float mass = (part[1] + 1.f) * exp2f((part[0] - m) * sc);  // 0 for an empty segment
  return mass >= 0x1p-100f ? static_cast<double>(mass) : 0.0;
}

template <typename T>
__device__ Segment pick_segment(const SampleArgs& a, int64_t b, float m, float inv_t, double u) {
  const float* part = a.partial + b * a.nseg * 3;
  const float sc = inv_t * kLog2e;
  double total = 0.0;
  for (int g = 0; g < a.nseg; ++g) total += segment_mass(part + 3 * g, m, sc);
  const double target = u * total;
  // the first segment whose cumulative mass passes the target, else (rounding) the last with mass
  int seg = 0;
  double before = 0.0, mass = 0.0, cum = 0.0;
  for (int g = 0; g < a.nseg; ++g) {
    const double here = segment_mass(part + 3 * g, m, sc);
    if (here > 0.0) { seg = g; before = cum; mass = here; }
    cum += here;
    if (here > 0.0 && target < cum) break;
  }
  const int64_t nv = a.V / VecWidth<T>::value;
  const int64_t per = split_segment_vectors(nv, a.nseg);
  const bool last = seg == a.nseg - 1;
  Segment s;
  s.begin = min(seg * per, nv) * VecWidth<T>::value;
  s.end = last ? a.V : min((seg + 1) * per, nv) * VecWidth<T>::value;
  s.u = fmin(fmax((target - before) / mass, 0.0), 0x1.fffffffffffffp-1);
  s.total = static_cast<float>(total);
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  const T* p = static_cast<const T*>(a.logits) + b * a.row_stride;
  const int64_t V = a.V;
  const float m = a.stats[b], log_s = a.stats[a.B + b];
  const bool greedy = !(a.temperature > 0.f);
  // capped as the statistics pass caps it (logp_fwd.cuh), so both agree below T = 2^-126
  const float inv_t = greedy ? 1.0f : inverse_temperature(a.temperature);
  const float nan = __int_as_float(0x7fc00000);
  if (!(isfinite(m) && isfinite(log_s))) {
    if (tid == 0) { a.tokens[b] = -1; a.logp[b] = nan; a.processed_logp[b] = nan; }
    return;
  }
  const uint64_t seed = static_cast<uint64_t>(a.seeds[b]);
  const int64_t k = (!greedy && a.top_k > 0) ? (a.top_k < V ? a.top_k : V) : 0;
  const bool use_p = !greedy && a.top_p < 1.f;
  const bool use_m = !greedy && a.min_p > 0.f;
  const float tau_m = use_m ? -logf(a.min_p) : INFINITY;
  const bool plain = !greedy && k == 0 && !use_p && !use_m;

  float tau_k = INFINITY, tau_p = INFINITY;
  float z_given = -1.f;       // mass of the top-k set when known before the gather
  bool gathered = false, k_exact = (k == 0);
  float hi_gather = 0.f;
  int cnt[kPivots];
  float ms[kPivots];

  // Phase A: top-k bracket by counts.
  if (k > 0) {
    float lo = -1.f, hi = INFINITY;
    for (int it = 0; it < 40; ++it) {
      set_pivots(sh, lo, hi);
      __syncthreads();
      count_pass<T, false>(p, V, m, inv_t, sh, cnt, ms);
      int j = 0;
      while (j < kPivots - 1 && cnt[j] < k) ++j;
      if (j > 0) lo = sh.pivots[j - 1];
      hi = sh.pivots[j];
      __syncthreads();
      if (cnt[j] <= kCap) { gathered = true; hi_gather = hi; break; }
      if (converged(lo, hi)) { tau_k = hi; k_exact = true; break; }
    }
  }
  // Phase B: top-p bracket by mass (relative to the top-k set), when not gathered yet. With
  // min-p, its threshold is a pivot while it lies inside the bracket: when the min-p set
  // holds less than the top-p target, min-p alone decides the kept set (top-p would keep
  // more), which settles the row after one pass instead of narrowing top-p to the last bit.
  if (!gathered && use_p) {
    float lo = -1.f, hi = tau_k;
    float target = -1.f;
    for (int it = 0; it < 40; ++it) {
      set_pivots(sh, lo, hi);
      if (use_m) insert_pivot(sh, lo, hi, tau_m);
      __syncthreads();
      count_pass<T, true>(p, V, m, inv_t, sh, cnt, ms);
      if (target < 0.f) { z_given = ms[kPivots - 1]; target = a.top_p * z_given; }
      int jm = -1;
      for (int j = 0; j < kPivots; ++j)
        if (use_m && sh.pivots[j] == tau_m) jm = j;
      int j = 0;
      while (j < kPivots - 1 && ms[j] < target) ++j;
      if (j > 0) lo = sh.pivots[j - 1];
      hi = sh.pivots[j];
      __syncthreads();
      if (jm >= 0 && ms[jm] < target) {  // min-p binds; tau_p stays unknown (infinite)
        if (cnt[jm] <= kCap) { gathered = true; hi_gather = tau_m; }
        break;
      }
      if (cnt[j] <= kCap) { gathered = true; hi_gather = hi; break; }
      if (converged(lo, hi)) { tau_p = hi; break; }
    }
  }
  // Min-p alone (or with an exact top-k) can still be finished in shared memory if small.
  if (!gathered && !use_p && use_m && tau_m < tau_k) {
    set_pivots(sh, -1.f, tau_m);
    __syncthreads();
    count_pass<T, false>(p, V, m, inv_t, sh, cnt, ms);
    __syncthreads();
    if (cnt[kPivots - 1] <= kCap) { gathered = true; hi_gather = tau_m; }
  }

  Pick pick{-INFINITY, 0x7fffffff};
  float z_f = 0.f, d_tok = 0.f;
  if (gathered) {
    if (tid == 0) sh.count = 0;
    __syncthreads();
    for_each_elem(p, V, [&](int64_t idx, float x) {
      // d >= 0, but a row's max of signed zeros may be -0, and -0 - (+0) is -0, whose bits
      // would sort a tied +0 after every other candidate (a GPU fuzz find: 1/9 for 1/10)
      const float d = fabsf((m - x) * inv_t);
      if (d <= hi_gather) {
        const int slot = atomicAdd(&sh.count, 1);
        if (slot < kCap)
          sh.cand[slot] = (static_cast<unsigned long long>(__float_as_uint(d)) << 32) |
                          static_cast<unsigned long long>(idx);
      }
    });
    __syncthreads();
    const int n = min(sh.count, kCap);
    int n2 = 1;
    while (n2 < n) n2 <<= 1;
    for (int i = n + tid; i < n2; i += kThreads) sh.cand[i] = ~0ull;
    __syncthreads();
    for (int kk = 2; kk <= n2; kk <<= 1) {
      for (int jj = kk >> 1; jj > 0; jj >>= 1) {
        for (int i = tid; i < n2; i += kThreads) {
          const int ixj = i ^ jj;
          if (ixj > i) {
            const unsigned long long x = sh.cand[i], y = sh.cand[ixj];
            if ((x > y) == ((i & kk) == 0)) { sh.cand[i] = y; sh.cand[ixj] = x; }
          }
        }
        __syncthreads();
      }
    }
    scan_masses(sh, n);
    int n_k = n;
    if (!k_exact) n_k = end_of_ties(sh, static_cast<int>(k) - 1, n);
    const float z_k = z_given >= 0.f ? z_given : sh.cum[n_k - 1];
    int n_f = n_k;
    if (use_p) {
      const float target = a.top_p * z_k;
      int first = n_k;
      for (int i = tid; i < n_k; i += kThreads)
        if (sh.cum[i] >= target) first = min(first, i);
      first = block_min_int<kThreads>(first, sh.ired);
      if (first < n_k) n_f = min(n_f, end_of_ties(sh, first, n));
    }
    if (use_m) {
      int first = n;
      for (int i = tid; i < n; i += kThreads)
        if (__uint_as_float(cand_key(sh, i)) > tau_m) first = min(first, i);
      n_f = min(n_f, block_min_int<kThreads>(first, sh.ired));
    }
    for (int i = tid; i < n_f; i += kThreads) {
      const int idx = static_cast<int>(sh.cand[i] & 0xffffffffu);
      const float d = __uint_as_float(cand_key(sh, i));
      pick = better(pick, Pick{-d + gumbel_noise(seed, idx), idx});
    }
    pick = block_argmax(pick, sh);
    z_f = sh.cum[n_f - 1];
  } else if (plain && a.nseg > 1 && !a.tma) {
    const Segment g = pick_segment<T>(a, b, m, inv_t, row_uniform(seed));
    const T* q = p + g.begin;  // a whole number of vectors on: p's alignment holds
    const int64_t n = g.end - g.begin;
    float segment_total;
    pick = is_aligned16(p) ? plain_draw<T, true>(q, n, m, inv_t, g.u, sh, segment_total)
                           : plain_draw<T, false>(q, n, m, inv_t, g.u, sh, segment_total);
    pick.idx += static_cast<int>(g.begin);
    z_f = g.total;
  } else if (plain && plain_groups<T>(V) <= kCap) {
    pick = is_aligned16(p) ? plain_draw<T, true>(p, V, m, inv_t, row_uniform(seed), sh, z_f)
                           : plain_draw<T, false>(p, V, m, inv_t, row_uniform(seed), sh, z_f);
  } else {
    const float tau = greedy ? 0.f : fminf(fminf(tau_k, tau_p), tau_m);
    float z = 0.f;
    GumbelRun noise(seed);
    for_each_elem(p, V, [&](int64_t idx, float x) {
      const float d = (m - x) * inv_t;
      if (d <= tau) {
        z += mass_of(d);
        const float g = greedy ? 0.f : noise(static_cast<uint32_t>(idx));
        pick = better(pick, Pick{-d + g, static_cast<int>(idx)});
      }
    });
    z_f = block_sum<kThreads>(z, sh.fred);
    pick = block_argmax(pick, sh);
  }
  if (tid == 0) {
    const int tok = pick.idx;
    const float x = to_float(p[tok]);
    d_tok = (m - x) * inv_t;
    a.tokens[b] = tok;
    a.logp[b] = logp_from_stats(x, m, inv_t, log_s);
    a.processed_logp[b] = greedy ? 0.f : -d_tok - logf(z_f);
  }
}

}  // namespace

const char* sample(const SampleArgs& a, void* stream) {
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.B == 0) return nullptr;
  if (a.V > 0x7fffffffLL) return "sample: vocabulary larger than 2^31 - 1";
  if (a.V == 0) return "sample: empty vocabulary";
  const float stats_temperature = a.temperature > 0.f ? a.temperature : 1.0f;
  // The statistics pass alone: every pointer not set here stays null (no tokens, no outputs).
  LogpFwdArgs f{};
  f.logits = a.logits;
  f.dtype = a.dtype;
  f.M = f.R = a.B;
  f.V = a.V;
  f.row_stride = a.row_stride;
  f.temperature = stats_temperature;
  f.ignore_index = -100;
  f.logp_stride = 1;
  f.stats = a.stats;
  f.nseg = a.nseg;
  f.partial = a.partial;
  const char* err = a.tma ? logp_forward_tma(f, stream) : logp_forward(f, stream);
  if (err != nullptr) return err;
  switch (a.dtype) {
    case kF32: sample_kernel<float><<<a.B, kThreads, 0, s>>>(a); break;
    case kBF16: sample_kernel<bf16_t><<<a.B, kThreads, 0, s>>>(a); break;
    case kF16: sample_kernel<f16_t><<<a.B, kThreads, 0, s>>>(a); break;
    default: return "sample: unsupported dtype code";
  }
  return last_error();
}

}  // namespace rlk
