// logp / logp_entropy forward: one pass over the logits (the backward: logp_backward.cu).
#include "logp_fwd.cuh"

namespace rlk {
namespace {

// The token's logit, read before the row's statistics so that its latency hides behind them
// (0 when logp is not asked for or the token is outside the row; finish_row then ignores it).
template <typename T>
__device__ __forceinline__ float token_logit(const LogpFwdArgs& a, const T* p, int64_t tok) {
  return (a.logp && tok >= 0 && tok < a.V) ? to_float(p[tok]) : 0.f;
}

// Writes a row's outputs (slot i) from its statistics; NaN/empty rule in one place.
__device__ __forceinline__ void finish_row(const LogpFwdArgs& a, int64_t i, float raw_tok,
                                           int64_t tok, const RowAcc& r, float inv_t) {
  const float nan = __int_as_float(0x7fc00000);
  const float log_s = row_log_sum(r);
  const bool empty = r.m == -INFINITY;
  // m * inv_t is exact in double: the float64 lse carries what float32 would round away
  if (a.lse) {
    const double m = r.m, scale = inv_t, rest = log_s;
    a.lse[i] = empty ? -INFINITY : fma(m, scale, rest);
  }
  if (a.stats) { a.stats[i] = r.m; a.stats[a.R + i] = empty ? nan : log_s; }
  if (a.entropy) a.entropy[i] = empty ? nan : row_entropy(r, log_s);
  if (a.logp) {
    float lp = nan;
    if (!empty && tok >= 0 && tok < a.V) lp = logp_from_stats(raw_tok, r.m, inv_t, log_s);
    a.logp[i * a.logp_stride] = lp;
  }
}

// Rows that need no statistics: ignored tokens (never read) and rows outside [0, M).
__device__ __forceinline__ bool finish_trivial(const LogpFwdArgs& a, int64_t i, int64_t row,
                                               int64_t tok) {
  const bool ignored = a.tokens && tok == a.ignore_index;
  const bool bad = row < 0 || row >= a.M;
  if (!ignored && !bad) return false;
  const float v = ignored ? 0.f : __int_as_float(0x7fc00000);
  if (a.logp) a.logp[i * a.logp_stride] = v;
  if (a.entropy) a.entropy[i] = v;
  if (a.lse) a.lse[i] = v;
  if (a.stats) { a.stats[i] = v; a.stats[a.R + i] = v; }
  return true;
}

// Blocks per SM the forward kernels ask registers for (0: the compiler's choice). Rows on
// 16-byte boundaries: enough that each SM keeps 80 KiB of 16-byte loads in flight (U per
// thread, 48 registers a thread; left to itself the compiler gives these kernels 56-58 and 4
// blocks), and with the entropy the compiler's choice (at 48 it spills the row pointer
// inside the loop). Rows at any alignment (ANY, row_vectors.cuh) load twice the registers:
// 64 KiB in flight, 64 registers.
constexpr int fwd_min_blocks(int threads, int unroll, bool ent, bool any) {
  if (any) return 4096 / (threads * unroll);
  return ent ? 0 : 5120 / (threads * unroll);
}

// Whole row in one block (V below the split), U vectors in flight per thread.
template <typename T, int THREADS, bool ENT, bool ANY, int U = 4>
__global__ void RLK_LAUNCH_BOUNDS(THREADS, fwd_min_blocks(THREADS, U, ENT, ANY))
    logp_fwd_kernel(LogpFwdArgs a) {
  const int64_t i = blockIdx.x;
  const RowInfo ri = row_info(a, i);
  if (skip_row(a, ri)) {
    if (threadIdx.x == 0) finish_trivial(a, i, ri.row, ri.tok);
    return;
  }
  const T* p = static_cast<const T*>(a.logits) + ri.row * a.row_stride;
  const float raw_tok = threadIdx.x == 0 ? token_logit(a, p, ri.tok) : 0.f;
  const RowAcc r = row_stats<T, THREADS, U, ENT, ANY>(p, a.V, ri.inv_t * kLog2e);
  if (threadIdx.x == 0) finish_row(a, i, raw_tok, ri.tok, r, ri.inv_t);
}

// Large V: block (i, seg) reduces one fixed-size segment of row i into part[i][seg]; the merge
// kernel combines the segments in order. Segment sizes depend on V only (batch invariance).
template <typename T, bool ENT, bool ANY>
__global__ void RLK_LAUNCH_BOUNDS(kSplitThreads,
                                  fwd_min_blocks(kSplitThreads, kSplitUnroll, ENT, ANY))
    logp_fwd_partial_kernel(LogpFwdArgs a) {
  const int64_t i = blockIdx.x;
  const int seg = blockIdx.y, nseg = gridDim.y;
  const RowInfo ri = row_info(a, i);
  if (skip_row(a, ri)) return;
  const T* p = static_cast<const T*>(a.logits) + ri.row * a.row_stride;
  const int64_t per = split_segment_vectors(a.V / VecWidth<T>::value, nseg);
  const RowAcc r = row_stats_range<T, kSplitThreads, kSplitUnroll, ENT, ANY>(
      p, a.V, ri.inv_t * kLog2e, seg * per, (seg + 1) * per, seg == nseg - 1);
  if (threadIdx.x == 0) {
    float* out = a.partial + (i * nseg + seg) * 3;
    out[0] = r.m;
    out[1] = r.s;
    out[2] = r.w;
  }
}

template <typename T, bool ENT>
__global__ void logp_fwd_merge_kernel(LogpFwdArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.R) return;
  const RowInfo ri = row_info(a, i);
  if (finish_trivial(a, i, ri.row, ri.tok)) return;
  const float sc = ri.inv_t * kLog2e;
  const T* p = static_cast<const T*>(a.logits) + ri.row * a.row_stride;
  const float raw_tok = token_logit(a, p, ri.tok);
  const float* part = a.partial + i * a.nseg * 3;
  RowAcc r{part[0], part[1], part[2]};
  for (int seg = 1; seg < a.nseg; ++seg)
    r = acc_combine<ENT>(r, RowAcc{part[3 * seg], part[3 * seg + 1], part[3 * seg + 2]}, sc);
  finish_row(a, i, raw_tok, ri.tok, r, ri.inv_t);
}

template <typename T, int THREADS, bool ANY>
void launch_fwd(const LogpFwdArgs& a, rlkStream_t s) {
  if (a.entropy) logp_fwd_kernel<T, THREADS, true, ANY><<<a.R, THREADS, 0, s>>>(a);
  else logp_fwd_kernel<T, THREADS, false, ANY><<<a.R, THREADS, 0, s>>>(a);
}

template <typename T, bool ANY>
void launch_fwd_split(const LogpFwdArgs& a, rlkStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.R), static_cast<unsigned>(a.nseg));
  if (a.entropy) logp_fwd_partial_kernel<T, true, ANY><<<grid, kSplitThreads, 0, s>>>(a);
  else logp_fwd_partial_kernel<T, false, ANY><<<grid, kSplitThreads, 0, s>>>(a);
}

template <typename T>
void launch_merge(const LogpFwdArgs& a, rlkStream_t s) {
  const unsigned blocks = static_cast<unsigned>((a.R + 127) / 128);
  if (a.entropy) logp_fwd_merge_kernel<T, true><<<blocks, 128, 0, s>>>(a);
  else logp_fwd_merge_kernel<T, false><<<blocks, 128, 0, s>>>(a);
}

// Forward launch shapes, by V only (batch invariance). Rows of V >= 65536 split into segments
// of at most 32768 elements, each a 256-thread block; shorter rows take one block, 256 threads
// from V = 16384, so that a 32768-element row is one such segment (four rounds of four
// vectors per thread). With 512 threads (two rounds, then the block reduction and the token's
// logit) rows of V = 32768 read at 59-62% of the copy bandwidth on the H200 (2026-12-03);
// benchmarks/cuda/logp_shapes.cu times the alternatives.
// Rows that do not all start on 16-byte boundaries take the kernels built for any alignment
// (ANY); the others keep kernels without the shifts' code and registers.
template <typename T, bool ANY>
void launch_fwd_shaped(const LogpFwdArgs& a, rlkStream_t s) {
  if (a.nseg > 1) launch_fwd_split<T, ANY>(a, s);
  else if (a.V >= 16384) launch_fwd<T, 256, ANY>(a, s);
  else launch_fwd<T, 128, ANY>(a, s);
}

template <typename T>
void launch_fwd_sized(const LogpFwdArgs& a, rlkStream_t s) {
  if (rows_aligned(a.logits, a.M, a.row_stride, sizeof(T))) launch_fwd_shaped<T, false>(a, s);
  else launch_fwd_shaped<T, true>(a, s);
}

}  // namespace

const char* select_device(int device) {
  const rlkError_t e = rlkSetDevice(device);
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

int logp_forward_segments(int64_t V) { return V >= 65536 ? static_cast<int>((V + 32767) / 32768) : 1; }

const char* logp_forward(const LogpFwdArgs& a, void* stream) {
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.R == 0) return nullptr;
  if (a.nseg != logp_forward_segments(a.V)) return "logp_forward: nseg must be logp_forward_segments(V)";
  if (a.nseg > 1 && a.partial == nullptr) return "logp_forward: split rows need a partial buffer";
  if (a.R > 0x7fffffffLL) return "logp_forward: too many rows for one launch";
  switch (a.dtype) {
    case kF32: launch_fwd_sized<float>(a, s); break;
    case kBF16: launch_fwd_sized<bf16_t>(a, s); break;
    case kF16: launch_fwd_sized<f16_t>(a, s); break;
    default: return "logp_forward: unsupported dtype code";
  }
  const char* err = last_error();
  return (err != nullptr || a.nseg == 1) ? err : logp_forward_merge(a, s);
}

const char* logp_forward_merge(const LogpFwdArgs& a, rlkStream_t s) {
  switch (a.dtype) {
    case kF32: launch_merge<float>(a, s); break;
    case kBF16: launch_merge<bf16_t>(a, s); break;
    case kF16: launch_merge<f16_t>(a, s); break;
    default: return "logp_forward: unsupported dtype code";
  }
  return last_error();
}

}  // namespace rlk
