// linear_policy_loss's one pass over a row chunk of float32 logits: each row's softmax
// statistics (logp, entropy, lse) and its logits gradient up to one factor per row, written
// while the statistics are gathered, so the logits are read once instead of twice.
//
// d logp(tok) / d x_j = (onehot_j - p_j) / T. With an offset m per row, e_j = exp(x_j / T - m)
// and scale = exp(m - lse), p_j = scale * e_j, so the row's gradient is
//   g / T * (onehot - p) = -(g / T) * scale * (e - onehot / scale).
// The partial pass writes e with m = x_tok / T (known before the row is read: e_tok = 1,
// scale = p_tok); the finish pass replaces e_tok by 1 - 1 / p_tok. The caller multiplies the
// GEMM results by -(g / T) * scale per row. When p_tok < 2^-100 (e and 1 / p_tok would near
// the output type's range) the finish pass rewrites the row with m = max / T instead; rows holding
// NaN, or no finite logit, are rewritten as zeros (their scale is NaN). Outputs: float32 or
// bfloat16 (float16's range cannot hold the caller's scaled hidden rows).
#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kW = 4;  // float32 logits per 16-byte vector

// Largest log2(1 / p_tok) kept with the token offset: e and 1 / p_tok then stay below 2^101,
// far inside bfloat16's and float32's range.
constexpr float kLimitLog2 = 100.f;

// Blocks per row at most: the finish kernel merges a row's segments one after the other.
constexpr int kMaxSegments = 64;

struct RowSetup {
  int64_t tok;
  float inv_t;
  bool live;  // a token inside the vocabulary, not ignored
};

__device__ __forceinline__ RowSetup setup(const RelProbArgs& a, int64_t i) {
  const int64_t tok = a.tokens[i];
  const float inv_t = 1.0f / (a.temp_rows ? a.temp_rows[i] : a.temperature);
  return RowSetup{tok, inv_t, tok != a.ignore_index && tok >= 0 && tok < a.V};
}

template <typename O>
__device__ __forceinline__ O* out_row(const RelProbArgs& a, int64_t i) {
  return static_cast<O*>(a.out) + i * a.out_row_stride;
}

// e = exp2(x * sc - off) (off = -inf: zeros) over vectors [v0, v1) of a row, and the scalar
// tail when asked.
template <typename O>
__device__ __forceinline__ void write_row(const float* x, O* o, int64_t V, int64_t v0,
                                          int64_t v1, float sc, float off, bool zeros,
                                          bool tail) {
  for (int64_t j = v0 + threadIdx.x; j < v1; j += kThreads) {
    float e[kW];
    if (zeros) {
#pragma unroll
      for (int k = 0; k < kW; ++k) e[k] = 0.f;
    } else {
      unpack<float>(load_stream(reinterpret_cast<const uint4*>(x) + j), e);
#pragma unroll
      for (int k = 0; k < kW; ++k) e[k] = exp2f(fmaf(e[k], sc, -off));
    }
    store_grad<O, kW>(o + j * kW, e);
  }
  const int64_t t = V / kW * kW + threadIdx.x;
  if (tail && t < V) o[t] = from_float<O>(zeros ? 0.f : exp2f(fmaf(x[t], sc, -off)));
}

// Block (row i, segment seg): the segment's statistics into partial[i][seg] and its e values.
template <typename O>
__global__ void __launch_bounds__(kThreads) partial_kernel(RelProbArgs a) {
  const int64_t i = blockIdx.x;
  const int seg = blockIdx.y, nseg = gridDim.y;
  const RowSetup row = setup(a, i);
  const float* x = a.logits + i * a.row_stride;
  O* o = out_row<O>(a, i);
  const int64_t nv = a.V / kW;
  const int64_t per = (nv + nseg - 1) / nseg;
  const int64_t v0 = seg * per, v1 = v0 + per < nv ? v0 + per : nv;
  const bool tail = seg == nseg - 1;
  if (!row.live) {  // ignored or outside the vocabulary: a zero gradient factor
    write_row<O>(x, o, a.V, v0, v1, 0.f, 0.f, true, tail);
    return;
  }
  const float sc = row.inv_t * kLog2e;
  const float off = x[row.tok] * sc;
  RowAcc r{-INFINITY, 0.f, 0.f};
  // One 16-byte vector (logical vector `vec`): into the statistics, then its e values out
  auto fold_and_store = [&](const uint4& raw, int64_t vec) {
    float v[kW];
    unpack<float>(raw, v);
    acc_chunk<true>(r, v, sc);
#pragma unroll
    for (int k = 0; k < kW; ++k) v[k] = exp2f(fmaf(v[k], sc, -off));
    store_grad<O, kW>(o + vec * kW, v);
  };
  int64_t j = v0 + threadIdx.x;
  for (; j + (kUnroll - 1) * kThreads < v1; j += kUnroll * kThreads) {
    uint4 raw[kUnroll];  // every load issued before the first use
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      raw[u] = load_stream(reinterpret_cast<const uint4*>(x) + j + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fold_and_store(raw[u], j + u * kThreads);
  }
  for (; j < v1; j += kThreads)
    fold_and_store(load_stream(reinterpret_cast<const uint4*>(x) + j), j);
  const int64_t t = nv * kW + threadIdx.x;
  if (tail && t < a.V) {
    const float v[1] = {x[t]};
    acc_chunk<true>(r, v, sc);
    o[t] = from_float<O>(exp2f(fmaf(v[0], sc, -off)));
  }
  r = acc_block_reduce<true, kThreads>(r, sc);
  if (threadIdx.x != 0) return;
  float* out = a.partial + (i * nseg + seg) * 3;
  out[0] = r.m;
  out[1] = r.s;
  out[2] = r.w;
}

// Block i: merges row i's segments, writes its outputs and the token's entry, and rewrites the
// row when the token offset does not fit (or the row holds no usable logits).
template <typename O>
__global__ void __launch_bounds__(kThreads) finish_kernel(RelProbArgs a, int nseg) {
  enum Rewrite { kNone, kMaxOffset, kZeros };
  const int64_t i = blockIdx.x;
  const RowSetup row = setup(a, i);
  const float sc = row.inv_t * kLog2e;
  const float* x = a.logits + i * a.row_stride;
  O* o = out_row<O>(a, i);
  __shared__ int rewrite;
  __shared__ float max_off;  // the row max in log2 units, for kMaxOffset
  if (threadIdx.x == 0) {
    rewrite = kNone;
    const float nan = __int_as_float(0x7fc00000);
    if (!row.live) {  // e is already zero
      const float v = row.tok == a.ignore_index ? 0.f : nan;
      a.logp[i] = a.entropy[i] = a.scale[i] = v;
      a.lse[i] = v;
    } else {
      const float* part = a.partial + i * nseg * 3;
      RowAcc r{part[0], part[1], part[2]};
      for (int s = 1; s < nseg; ++s)
        r = acc_combine<true>(r, RowAcc{part[3 * s], part[3 * s + 1], part[3 * s + 2]}, sc);
      const float log_s = row_log_sum(r);
      const bool empty = r.m == -INFINITY;
      // m * inv_t is exact in double: the float64 lse carries what float32 would round away
      const double m = r.m, inv_t = row.inv_t, rest = log_s;
      a.lse[i] = empty ? -INFINITY : fma(m, inv_t, rest);
      a.entropy[i] = empty ? nan : row_entropy(r, log_s);
      const float logp = empty ? nan : logp_from_stats(x[row.tok], r.m, row.inv_t, log_s);
      a.logp[i] = logp;
      if (logp != logp) {
        a.scale[i] = nan;
        rewrite = kZeros;
      } else if (-logp * kLog2e > kLimitLog2) {
        a.scale[i] = expf(-log_s);  // offset max / T: scale = exp(max / T - lse)
        max_off = r.m * sc;
        rewrite = kMaxOffset;
      } else {
        a.scale[i] = expf(logp);  // offset x_tok / T: scale = p_tok
        o[row.tok] = from_float<O>(-expm1f(-logp));  // e_tok - 1 / p_tok
      }
    }
  }
  __syncthreads();
  if (rewrite == kNone) return;
  write_row<O>(x, o, a.V, 0, a.V / kW, sc, max_off, rewrite == kZeros, true);
  __syncthreads();
  if (rewrite == kMaxOffset && threadIdx.x == 0) {
    // e_tok - exp(lse - max / T), the latter being the row's sum of e
    o[row.tok] = from_float<O>(exp2f(fmaf(x[row.tok], sc, -max_off)) - 1.f / a.scale[i]);
  }
}

template <typename O>
void launch(const RelProbArgs& a, rlkStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(a.nseg));
  partial_kernel<O><<<grid, kThreads, 0, s>>>(a);
  finish_kernel<O><<<static_cast<unsigned>(a.N), kThreads, 0, s>>>(a, a.nseg);
}

}  // namespace

int relative_probs_segments(int64_t V) {
  // ~16384 logits per block: each block first waits for its token's logit, so shorter ones
  // lose more to that wait (H200, 512 rows of V=128256: 3.79 ms per step at 8192 logits per
  // block, 3.40 at 16384, 3.37 at 32768, 4.89 at 4096)
  const int64_t seg = (V + 16383) / 16384;
  return static_cast<int>(seg < 1 ? 1 : (seg > kMaxSegments ? kMaxSegments : seg));
}

const char* relative_probs(const RelProbArgs& a, void* stream) {
  if (a.N == 0) return nullptr;
  if (a.N > 0x7fffffffLL) return "relative_probs: too many rows for one launch";
  if (a.V < 1) return "relative_probs: the vocabulary is empty";
  if (a.nseg < 1 || a.nseg > kMaxSegments)
    return "relative_probs: nseg must be within [1, 64] (relative_probs_segments(V) by default)";
  if (a.row_stride % kW != 0 || reinterpret_cast<uintptr_t>(a.logits) % 16 != 0)
    return "relative_probs: logits rows must start on 16-byte boundaries";
  if (a.out_row_stride % kW != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0)
    return "relative_probs: output rows must start on 16-byte boundaries";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  switch (a.out_dtype) {
    case kF32: launch<float>(a, s); break;
    case kBF16: launch<bf16_t>(a, s); break;
    default: return "relative_probs: the output dtype must be float32 or bfloat16";
  }
  return last_error();
}

}  // namespace rlk
