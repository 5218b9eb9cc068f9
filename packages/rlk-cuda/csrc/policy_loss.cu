// policy_loss: the clipped surrogate with its KL, GSPO and TIS options, in two launches each way.
//
// Forward: one block per sequence sums its per-token terms, token count and metric terms into
// a row of float64 partials; one single-block kernel reduces the rows in a fixed order and
// applies the aggregation. Backward: one block per sequence finds its token count (and, for the
// GSPO sequence ratio, the sum of its token slopes); then every block reduces those counts in
// the same fixed order and writes its sequences' gradients. No float atomics: deterministic.
// The per-token math follows rlk.native.policy_loss in float32; masked tokens are never used.
#include <cmath>

#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kRowThreads = 512;
constexpr int kFinalThreads = 256;
constexpr int kMaxGradBlocks = 1024;  // grad blocks loop over sequences beyond this
constexpr int kRowStats = kPolicyLossRowStats;
constexpr int kRowWarps = kRowThreads / RLK_WARP_SIZE;

// Forward row partials, then backward row partials (same scratch layout, fewer columns).
enum RowStat { kTerm, kTokens, kClipped, kRatio, kKl, kTruncated };
enum GradRowStat { kGradTokens, kSlopeSum };
enum Aggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum, kSeqMeanTokenSumNorm };

struct Token {
  float mask, logp, old, adv, ref, rollout;
};

template <int kVec>
__device__ __forceinline__ void load(const float* p, float (&out)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = p[j];
  }
}

// Tokens [t, t + kVec) of sequence b (absent optional inputs read as 0).
template <int kVec>
__device__ __forceinline__ void load_tokens(const PolicyLossArgs& a, int64_t b, int64_t t,
                                            Token (&x)[kVec]) {
  const int64_t at = b * a.T + t;
  float mask[kVec], logp[kVec], old[kVec], adv[kVec], ref[kVec] = {}, rollout[kVec] = {};
  load<kVec>(a.mask + at, mask);
  load<kVec>(a.logp + at, logp);
  load<kVec>(a.old_logp + at, old);
  if (a.adv_per_token) {
    load<kVec>(a.advantages + at, adv);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) adv[j] = a.advantages[b];
  }
  if (a.ref_logp != nullptr) load<kVec>(a.ref_logp + at, ref);
  if (a.rollout_logp != nullptr) load<kVec>(a.rollout_logp + at, rollout);
#pragma unroll
  for (int j = 0; j < kVec; ++j) x[j] = Token{mask[j], logp[j], old[j], adv[j], ref[j], rollout[j]};
}

// Calls f(token) for every token of sequence b whose mask is set, in a fixed thread layout.
template <int kVec, typename F>
__device__ __forceinline__ void for_each_active(const PolicyLossArgs& a, int64_t b, F f) {
  for (int64_t t = static_cast<int64_t>(threadIdx.x) * kVec; t < a.T; t += kRowThreads * kVec) {
    Token x[kVec];
    load_tokens<kVec>(a, b, t, x);
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (x[j].mask != 0.0f) f(x[j]);
  }
}

// torch.clamp: NaN stays NaN.
__device__ __forceinline__ float clamp(float v, float low, float high) {
  return v < low ? low : (v > high ? high : v);
}

struct Terms {
  float ratio;
  float value;     // clipped surrogate times the TIS weight
  float slope;     // its derivative w.r.t. the log ratio (0 where clipping stops the gradient)
  float kl;        // KL estimate (0 without ref_logp)
  float kl_slope;  // its derivative w.r.t. logp
  bool clipped;    // the clipped branch was taken (the clip fraction metric)
  bool truncated;  // the TIS weight hit its cap
};

__device__ __forceinline__ Terms token_terms(const PolicyLossArgs& a, const Token& x,
                                             float log_ratio) {
  Terms r;
  r.ratio = expf(log_ratio);
  float tis = 1.0f;
  r.truncated = false;
  if (a.rollout_logp != nullptr) {
    tis = expf(x.old - x.rollout);
    if (a.tis_cap > 0.0f) {
      r.truncated = tis > a.tis_cap;
      tis = r.truncated ? a.tis_cap : tis;
    }
  }
  const float plain = -x.adv * r.ratio;
  const float clipped = -x.adv * clamp(r.ratio, a.ratio_low, a.ratio_high);
  float surrogate = max_nan(plain, clipped);
  bool flows = plain >= clipped;
  if (a.dual_clip > 0.0f) {
    const float floor = -x.adv * a.dual_clip;
    const bool dual = x.adv < 0.0f && floor < surrogate;
    surrogate = dual ? floor : surrogate;
    flows = flows && !dual;
  }
  r.clipped = clipped > plain;
  r.value = surrogate * tis;
  r.slope = (flows ? plain : 0.0f) * tis;
  r.kl = r.kl_slope = 0.0f;
  if (a.ref_logp != nullptr) {
    const float delta = x.logp - x.ref;
    if (a.kl_estimator == 1) {
      r.kl = delta, r.kl_slope = 1.0f;
    } else if (a.kl_estimator == 2) {
      r.kl = 0.5f * delta * delta, r.kl_slope = delta;
    } else {
      const float back = expf(-delta);
      r.kl = back - 1.0f + delta, r.kl_slope = 1.0f - back;
    }
  }
  return r;
}

// The GSPO sequence log ratio: the mean token log ratio of sequence b (0 when it is empty).
// Every thread of the block gets it.
template <int kVec>
__device__ __forceinline__ float sequence_log_ratio(const PolicyLossArgs& a, int64_t b,
                                                    double* scratch) {
  double v[2] = {0.0, 0.0};
  for_each_active<kVec>(a, b, [&](const Token& x) {
    v[0] += static_cast<double>(x.logp - x.old);
    v[1] += 1.0;
  });
  block_sum_array<kRowThreads>(v, scratch);
  return v[1] > 0.0 ? static_cast<float>(v[0] / v[1]) : 0.0f;
}

template <int kVec>
__global__ void __launch_bounds__(kRowThreads) forward_rows_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kRowWarps * kRowStats];
  const int64_t b = blockIdx.x;
  const float seq_log_ratio = a.sequence_ratio ? sequence_log_ratio<kVec>(a, b, scratch) : 0.0f;
  const bool kl_in_loss = a.ref_logp != nullptr && a.kl_coef != 0.0f;
  double v[kRowStats] = {};
  for_each_active<kVec>(a, b, [&](const Token& x) {
    const Terms t = token_terms(a, x, a.sequence_ratio ? seq_log_ratio : x.logp - x.old);
    v[kTerm] += static_cast<double>(kl_in_loss ? t.value + a.kl_coef * t.kl : t.value);
    v[kTokens] += 1.0;
    v[kClipped] += t.clipped ? 1.0 : 0.0;
    v[kRatio] += static_cast<double>(t.ratio);
    v[kKl] += static_cast<double>(t.kl);
    v[kTruncated] += t.truncated ? 1.0 : 0.0;
  });
  block_sum_array<kRowThreads>(v, scratch);
  if (threadIdx.x == 0)
#pragma unroll
    for (int k = 0; k < kRowStats; ++k) a.rows[b * kRowStats + k] = v[k];
}

// The rows in a fixed order, the aggregation, the metrics.
__global__ void __launch_bounds__(kFinalThreads) forward_final_kernel(PolicyLossArgs a) {
  enum { kLoss, kAllTokens, kSequences, kAllClipped, kAllRatio, kAllKl, kAllTruncated, kN };
  __shared__ double scratch[kFinalThreads / RLK_WARP_SIZE * kN];
  double v[kN] = {};
  for (int64_t b = threadIdx.x; b < a.B; b += kFinalThreads) {
    const double* row = a.rows + b * kRowStats;
    const double tokens = row[kTokens];
    const bool per_sequence_mean = a.agg == kSeqMeanTokenMean;
    v[kLoss] += per_sequence_mean ? (tokens > 0.0 ? row[kTerm] / tokens : 0.0) : row[kTerm];
    v[kAllTokens] += tokens;
    v[kSequences] += tokens > 0.0 ? 1.0 : 0.0;
    v[kAllClipped] += row[kClipped];
    v[kAllRatio] += row[kRatio];
    v[kAllKl] += row[kKl];
    v[kAllTruncated] += row[kTruncated];
  }
  block_sum_array<kFinalThreads>(v, scratch);
  if (threadIdx.x != 0) return;
  const double count = fmax(v[kAllTokens], 1.0);
  double divisor = count;
  if (a.agg == kSeqMeanTokenMean || a.agg == kSeqMeanTokenSum) divisor = fmax(v[kSequences], 1.0);
  if (a.agg == kSeqMeanTokenSumNorm) divisor = fmax(static_cast<double>(a.B) * a.T, 1.0);
  *a.loss = static_cast<float>(v[kLoss] / divisor);
  a.metrics[0] = static_cast<float>(v[kAllClipped] / count);
  a.metrics[1] = static_cast<float>(v[kAllRatio] / count);
  a.metrics[2] = static_cast<float>(v[kAllKl] / count);
  a.metrics[3] = static_cast<float>(v[kAllTruncated] / count);
}

// Backward, pass 1: each sequence's token count and, for the sequence ratio, its slope sum.
template <int kVec>
__global__ void __launch_bounds__(kRowThreads) backward_rows_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kRowWarps * 2];
  const int64_t b = blockIdx.x;
  const float log_ratio = a.sequence_ratio ? sequence_log_ratio<kVec>(a, b, scratch) : 0.0f;
  double v[2] = {0.0, 0.0};
  for_each_active<kVec>(a, b, [&](const Token& x) {
    v[kGradTokens] += 1.0;
    if (a.sequence_ratio) v[kSlopeSum] += static_cast<double>(token_terms(a, x, log_ratio).slope);
  });
  block_sum_array<kRowThreads>(v, scratch);
  if (threadIdx.x == 0) {
    a.rows[b * kRowStats + kGradTokens] = v[kGradTokens];
    a.rows[b * kRowStats + kSlopeSum] = v[kSlopeSum];
  }
}

// The weight of every token of a sequence with `tokens` tokens in the aggregated loss.
__device__ __forceinline__ float token_weight(const PolicyLossArgs& a, double tokens,
                                              double all_tokens, double sequences) {
  switch (a.agg) {
    case kTokenMean:
      return static_cast<float>(1.0 / fmax(all_tokens, 1.0));
    case kSeqMeanTokenMean:
      return tokens > 0.0 ? static_cast<float>(1.0 / tokens / fmax(sequences, 1.0)) : 0.0f;
    case kSeqMeanTokenSum:
      return static_cast<float>(1.0 / fmax(sequences, 1.0));
    default:
      return static_cast<float>(1.0 / fmax(static_cast<double>(a.B) * a.T, 1.0));
  }
}

// Backward, pass 2: every block reduces the counts (same order everywhere), then writes the
// gradient of its sequences, masked tokens included (as zeros).
template <int kVec>
__global__ void __launch_bounds__(kRowThreads) backward_grad_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kRowWarps * 2];
  double totals[2] = {0.0, 0.0};  // tokens, non-empty sequences
  for (int64_t b = threadIdx.x; b < a.B; b += kRowThreads) {
    const double tokens = a.rows[b * kRowStats + kGradTokens];
    totals[0] += tokens;
    totals[1] += tokens > 0.0 ? 1.0 : 0.0;
  }
  block_sum_array<kRowThreads>(totals, scratch);
  const float upstream = *a.grad_loss;
  const bool kl_in_loss = a.ref_logp != nullptr && a.kl_coef != 0.0f;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    const double* row = a.rows + b * kRowStats;
    const float weight = token_weight(a, row[kGradTokens], totals[0], totals[1]);
    // GSPO: the sequence log ratio is the mean of the token log ratios.
    const float through_sequence =
        a.sequence_ratio ? static_cast<float>(static_cast<double>(weight) * row[kSlopeSum] /
                                              fmax(row[kGradTokens], 1e-30))
                         : 0.0f;
    for (int64_t t = static_cast<int64_t>(threadIdx.x) * kVec; t < a.T;
         t += kRowThreads * kVec) {
      Token x[kVec];
      load_tokens<kVec>(a, b, t, x);
      float out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const bool active = x[j].mask != 0.0f;
        float grad = a.sequence_ratio ? x[j].mask * through_sequence : 0.0f;
        if (active && (!a.sequence_ratio || kl_in_loss)) {
          const Terms terms = token_terms(a, x[j], x[j].logp - x[j].old);
          if (!a.sequence_ratio) grad = weight * terms.slope;
          if (kl_in_loss) grad += weight * a.kl_coef * terms.kl_slope;
        }
        out[j] = grad * upstream;
      }
      float* dst = a.grad + b * a.T + t;
      if constexpr (kVec == 4) {
        *reinterpret_cast<float4*>(dst) = make_float4(out[0], out[1], out[2], out[3]);
      } else {
        dst[0] = out[0];
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16-byte loads when every row starts on a 16-byte boundary.
bool vectorizable(const PolicyLossArgs& a) {
  const void* pointers[] = {a.logp, a.old_logp, a.mask, a.ref_logp, a.rollout_logp, a.grad,
                            a.adv_per_token ? a.advantages : nullptr};
  if (a.T % 4 != 0) return false;
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

const char* launched() {
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

}  // namespace

const char* policy_loss_forward(const PolicyLossArgs& a, void* stream) {
  if (a.B > 0x7fffffffLL) return "policy_loss: too many sequences";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  const unsigned rows = static_cast<unsigned>(a.B);
  if (rows > 0) {
    if (vectorizable(a))
      forward_rows_kernel<4><<<rows, kRowThreads, 0, s>>>(a);
    else
      forward_rows_kernel<1><<<rows, kRowThreads, 0, s>>>(a);
    if (const char* e = launched()) return e;
  }
  forward_final_kernel<<<1, kFinalThreads, 0, s>>>(a);
  return launched();
}

const char* policy_loss_backward(const PolicyLossArgs& a, void* stream) {
  if (a.B == 0) return nullptr;
  if (a.B > 0x7fffffffLL) return "policy_loss: too many sequences";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  const unsigned rows = static_cast<unsigned>(a.B);
  const unsigned grad_blocks = rows < kMaxGradBlocks ? rows : kMaxGradBlocks;
  if (vectorizable(a)) {
    backward_rows_kernel<4><<<rows, kRowThreads, 0, s>>>(a);
    if (const char* e = launched()) return e;
    backward_grad_kernel<4><<<grad_blocks, kRowThreads, 0, s>>>(a);
  } else {
    backward_rows_kernel<1><<<rows, kRowThreads, 0, s>>>(a);
    if (const char* e = launched()) return e;
    backward_grad_kernel<1><<<grad_blocks, kRowThreads, 0, s>>>(a);
  }
  return launched();
}

}  // namespace rlk
