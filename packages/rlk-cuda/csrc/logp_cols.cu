// linear_logp forward over vocabulary chunks: each chunk's logits are reduced to partial
// softmax statistics (and the token's logit, by the chunk that holds it), then one merge pass
// combines the chunks in order and writes logp, entropy and lse.
#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;

template <typename T, bool ENT>
__global__ void __launch_bounds__(kThreads) cols_partial_kernel(LogpColsArgs a) {
  const int64_t i = blockIdx.x;
  const int64_t tok = a.tokens[i];
  if (tok == a.ignore_index) return;
  const float inv_t = 1.0f / (a.temp_rows ? a.temp_rows[i] : a.temperature);
  const T* p = static_cast<const T*>(a.logits) + i * a.row_stride;
  const RowAcc r = row_stats_range<T, kThreads, 4, ENT>(p, a.C, inv_t * kLog2e, 0, a.C, true);
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
    a.lse[i] = 0.f;
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
  a.lse[i] = empty ? -INFINITY : fmaf(r.m, inv_t, log_s);
  if (ENT) a.entropy[i] = empty ? nan : row_entropy(r, log_s);
  const bool ok = !empty && tok >= 0 && tok < a.vocab_total;
  a.logp[i] = ok ? logp_from_stats(a.tok_logit[i], r.m, inv_t, log_s) : nan;
}

template <typename T>
void launch_partial(const LogpColsArgs& a, rlkStream_t s) {
  if (a.entropy) cols_partial_kernel<T, true><<<static_cast<unsigned>(a.N), kThreads, 0, s>>>(a);
  else cols_partial_kernel<T, false><<<static_cast<unsigned>(a.N), kThreads, 0, s>>>(a);
}

const char* status() {
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

}  // namespace

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
  return status();
}

const char* logp_cols_merge(const LogpColsArgs& a, void* stream) {
  if (a.N == 0) return nullptr;
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>((a.N + 127) / 128);
  if (a.entropy) cols_merge_kernel<true><<<blocks, 128, 0, s>>>(a);
  else cols_merge_kernel<false><<<blocks, 128, 0, s>>>(a);
  return status();
}

}  // namespace rlk
