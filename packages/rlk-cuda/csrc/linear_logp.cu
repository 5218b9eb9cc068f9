// linear_logp forward over vocabulary chunks: each chunk's logits are reduced to partial
// softmax statistics (and the token's logit, by the chunk that holds it), then one merge pass
// combines the chunks in order and writes logp, entropy and lse. Also the soft cap of a float32
// logits chunk and its chain rule (rlk.lm_head's contract), one pass each.
#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;

template <typename T, bool ENT, bool ANY>
__global__ void __launch_bounds__(kThreads) cols_partial_kernel(LogpColsArgs a) {
  const int64_t i = blockIdx.x;
  const int64_t tok = a.tokens[i];
  if (tok == a.ignore_index) return;
  const float inv_t = 1.0f / (a.temp_rows ? a.temp_rows[i] : a.temperature);
  const T* p = static_cast<const T*>(a.logits) + i * a.row_stride;
  const RowAcc r =
      row_stats_range<T, kThreads, 4, ENT, ANY>(p, a.C, inv_t * kLog2e, 0, a.C, true);
  if (threadIdx.x != 0) return;
  float* out = a.partial + (i * a.nchunks + a.chunk) * 3;
  out[0] = r.m;
  out[1] = r.s;
  out[2] = r.w;
  const int64_t local = tok - a.col_offset;
  if (local >= 0 && local < a.C) a.tok_logit[i] = to_float(p[local]);
}

template <bool ENT>
__global__ void cols_merge_kernel(LogpColsArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.N) return;
  const int64_t tok = a.tokens[i];
  const float nan = __int_as_float(0x7fc00000);
  if (tok == a.ignore_index) {
    a.logp[i] = 0.f;
    a.lse[i] = 0.0;
    if (ENT) a.entropy[i] = 0.f;
    return;
  }
  const float inv_t = 1.0f / (a.temp_rows ? a.temp_rows[i] : a.temperature);
  const float sc = inv_t * kLog2e;
  const float* part = a.partial + i * a.nchunks * 3;
  RowAcc r{part[0], part[1], part[2]};
  for (int c = 1; c < a.nchunks; ++c)
    r = acc_combine<ENT>(r, RowAcc{part[3 * c], part[3 * c + 1], part[3 * c + 2]}, sc);
  const float log_s = row_log_sum(r);
  const bool empty = r.m == -INFINITY;
  // m * inv_t is exact in double: the float64 lse carries what float32 would round away
  const double m = r.m, scale = inv_t, rest = log_s;
  a.lse[i] = empty ? -INFINITY : fma(m, scale, rest);
  if (ENT) a.entropy[i] = empty ? nan : row_entropy(r, log_s);
  const bool ok = !empty && tok >= 0 && tok < a.vocab_total;
  a.logp[i] = ok ? logp_from_stats(a.tok_logit[i], r.m, inv_t, log_s) : nan;
}

// Block (row, column block): a grid-stride loop over the row's columns.
template <typename O, bool CHAIN>
__global__ void soft_cap_kernel(SoftCapArgs a) {
  const int64_t i = blockIdx.x;
  const float inv_cap = 1.0f / a.softcap;
  float* x = a.logits + i * a.row_stride;
  O* g = CHAIN ? static_cast<O*>(a.grad) + i * a.grad_row_stride : nullptr;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < a.C;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    if (CHAIN) {
      // a zero gradient stays zero: an ignored row's logits may be NaN (a NaN hidden state)
      const float v = x[j], d = to_float(g[j]);
      if (d != 0.f) g[j] = from_float<O>(d * (1.0f - v * v) * inv_cap);
    } else {
      x[j] = tanhf(x[j] * inv_cap);
    }
  }
}

template <typename O, bool CHAIN>
void launch_soft_cap(const SoftCapArgs& a, rlkStream_t s) {
  const unsigned column_blocks = static_cast<unsigned>(a.C < 65536 ? (a.C + 1023) / 1024 : 64);
  const dim3 grid(static_cast<unsigned>(a.N), column_blocks);
  soft_cap_kernel<O, CHAIN><<<grid, 256, 0, s>>>(a);
}

template <typename T>
void launch_partial(const LogpColsArgs& a, rlkStream_t s) {
  const unsigned grid = static_cast<unsigned>(a.N);
  // the linear ops' chunks have padded rows (rlk_cuda.linear.padded): the aligned kernels
  if (rows_aligned(a.logits, a.N, a.row_stride, sizeof(T))) {
    if (a.entropy) cols_partial_kernel<T, true, false><<<grid, kThreads, 0, s>>>(a);
    else cols_partial_kernel<T, false, false><<<grid, kThreads, 0, s>>>(a);
  } else {
    if (a.entropy) cols_partial_kernel<T, true, true><<<grid, kThreads, 0, s>>>(a);
    else cols_partial_kernel<T, false, true><<<grid, kThreads, 0, s>>>(a);
  }
}

}  // namespace

const char* soft_cap(const SoftCapArgs& a, void* stream) {
  if (a.N == 0 || a.C == 0) return nullptr;
  if (a.N > 0x7fffffffLL) return "soft_cap: too many rows for one launch";
  if (!(a.softcap > 0.f)) return "soft_cap: softcap must be > 0";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.grad == nullptr) {
    launch_soft_cap<float, false>(a, s);
    return last_error();
  }
  switch (a.grad_dtype) {
    case kF32: launch_soft_cap<float, true>(a, s); break;
    case kBF16: launch_soft_cap<bf16_t, true>(a, s); break;
    case kF16: launch_soft_cap<f16_t, true>(a, s); break;
    default: return "soft_cap: unsupported gradient dtype code";
  }
  return last_error();
}

const char* logp_cols_partial(const LogpColsArgs& a, void* stream) {
  if (a.N == 0 || a.C == 0) return nullptr;
  if (a.N > 0x7fffffffLL) return "logp_cols_partial: too many rows for one launch";
  if (a.chunk < 0 || a.chunk >= a.nchunks) return "logp_cols_partial: chunk outside [0, nchunks)";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  switch (a.dtype) {
    case kF32: launch_partial<float>(a, s); break;
    case kBF16: launch_partial<bf16_t>(a, s); break;
    case kF16: launch_partial<f16_t>(a, s); break;
    default: return "logp_cols_partial: unsupported dtype code";
  }
  return last_error();
}

const char* logp_cols_merge(const LogpColsArgs& a, void* stream) {
  if (a.N == 0) return nullptr;
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>((a.N + 127) / 128);
  if (a.entropy) cols_merge_kernel<true><<<blocks, 128, 0, s>>>(a);
  else cols_merge_kernel<false><<<blocks, 128, 0, s>>>(a);
  return last_error();
}

}  // namespace rlk
