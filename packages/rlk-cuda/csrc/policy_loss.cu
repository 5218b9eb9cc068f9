// policy_loss: every rlk.PolicyLossOptions option, in two launches each way.
//
// Forward: one block per sequence first finds the sequence's statistic when the options need
// one (the GSPO mean log ratio, VESPO's log weight), then sums its per-token terms, token count
// and metric terms into a row of float64 partials; one single-block kernel reduces the rows in
// a fixed order and applies the aggregation. Backward: one block per sequence finds its token
// count, its statistic and (exact sequence ratio) the sum of its terms' derivatives through the
// ratio; then every block reduces the counts in the same fixed order and writes its sequences'
// gradients. A forward asked for the gradient too (at upstream 1, for rlk's eager path) has
// its row blocks record what the backward's first pass would, the same sums in the same order,
// then runs the backward's second pass, whose first block also does the final reduction: two
// launches and two reads of the inputs instead of four and three. No float atomics:
// deterministic. The per-token math is rlk.native.policy_loss's, in float32; every input is
// read in its own element type; masked tokens are never read past the mask, so NaN or inf
// there is harmless.
#include <cmath>

#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // tokens in flight per thread
constexpr int kMaxGradBlocks = 1024;  // grad blocks loop over sequences beyond this
constexpr int kWarps = kThreads / RLK_WARP_SIZE;
constexpr float kVespoLogRatioBound = 20.0f;   // TRL's per-token log-ratio clamp
constexpr float kVespoLogWeightMin = -18.420680743952367f;  // log(1e-8)
constexpr float kVespoLogWeightMax = 20.0f;

enum Objective { kPpo, kCispo, kSapo, kVespo };
enum RatioLevel { kTokenRatio, kSequenceRatio, kSequenceTokenRatio };
enum KlEstimator { kK1, kK2, kK3, kAbs };
enum Aggregation { kTokenMean, kTokenSum, kSeqMeanTokenMean, kSeqMeanTokenSum, kSeqMeanTokenSumNorm };
// A sequence's float64 partials: the forward's, then the sequence statistic and the sum through
// the exact sequence ratio that the gradient pass reads (with kTokens).
enum RowStat {
  kTerm, kTokens, kClipped, kClipLow, kClipHigh, kDual, kRatio, kKl, kTruncated,
  kSequence, kThroughRatio
};
constexpr int kMetrics = 7;  // kClipped .. kTruncated
static_assert(kPolicyLossRowStats == kThroughRatio + 1, "row layout");

__device__ __forceinline__ float load(const Operand& o, int64_t i) {
  switch (o.type) {
    case kF32: return static_cast<const float*>(o.data)[i];
    case kBF16: return to_float(static_cast<const bf16_t*>(o.data)[i]);
    case kF16: return to_float(static_cast<const f16_t*>(o.data)[i]);
    case kF64: return static_cast<float>(static_cast<const double*>(o.data)[i]);
    case kU8: return static_cast<float>(static_cast<const uint8_t*>(o.data)[i]);
    case kI8: return static_cast<float>(static_cast<const int8_t*>(o.data)[i]);
    case kI16: return static_cast<float>(static_cast<const int16_t*>(o.data)[i]);
    case kI32: return static_cast<float>(static_cast<const int32_t*>(o.data)[i]);
    default: return static_cast<float>(static_cast<const int64_t*>(o.data)[i]);
  }
}

__device__ __forceinline__ void store(void* p, int type, int64_t i, float v) {
  switch (type) {
    case kBF16: static_cast<bf16_t*>(p)[i] = from_float<bf16_t>(v); break;
    case kF16: static_cast<f16_t*>(p)[i] = from_float<f16_t>(v); break;
    case kF64: static_cast<double*>(p)[i] = static_cast<double>(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// torch.clamp: NaN stays NaN.
__device__ __forceinline__ float clamp(float v, float low, float high) {
  return v < low ? low : (v > high ? high : v);
}

struct Token {
  bool real;
  float logp, old, adv, ref, rollout, weight;
};

// Token t of sequence b (absent inputs read as 0, an absent weight as 1).
__device__ __forceinline__ Token load_token(const PolicyLossArgs& a, int64_t b, int64_t t) {
  const int64_t at = b * a.T + t;
  Token x{};
  x.real = load(a.mask, at) != 0.0f;
  if (!x.real) return x;
  x.logp = load(a.logp, at);
  x.old = load(a.old_logp, at);
  x.adv = load(a.advantages, a.adv_per_token ? at : b);
  if (a.ref_logp.data != nullptr) x.ref = load(a.ref_logp, at);
  if (a.rollout_logp.data != nullptr) x.rollout = load(a.rollout_logp, at);
  x.weight = a.importance_weights.data != nullptr
                 ? load(a.importance_weights, a.weights_per_token ? at : b)
                 : 1.0f;
  return x;
}

// Calls f(token, t) for every real token of sequence b, kUnroll tokens in flight per thread.
template <typename F>
__device__ __forceinline__ void for_each_real(const PolicyLossArgs& a, int64_t b, F f) {
  for (int64_t t0 = threadIdx.x; t0 < a.T; t0 += static_cast<int64_t>(kThreads) * kUnroll) {
    Token x[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t t = t0 + static_cast<int64_t>(j) * kThreads;
      x[j] = t < a.T ? load_token(a, b, t) : Token{};
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (x[j].real) f(x[j], t0 + static_cast<int64_t>(j) * kThreads);
  }
}

// The importance weight on a token's policy term and whether the TIS cap truncated it.
__device__ __forceinline__ float importance_weight(const PolicyLossArgs& a, const Token& x,
                                                   bool* truncated) {
  float w = 1.0f;
  *truncated = false;
  if (a.rollout_logp.data != nullptr) {
    w = expf(x.old - x.rollout);
    if (a.s.tis_cap > 0.0f) {
      *truncated = w > a.s.tis_cap;
      w = *truncated ? a.s.tis_cap : w;
    }
  }
  return a.importance_weights.data != nullptr ? w * x.weight : w;
}

__device__ __forceinline__ bool has_weight(const PolicyLossArgs& a) {
  return a.rollout_logp.data != nullptr || a.importance_weights.data != nullptr;
}

struct Terms {
  float value;           // the token's term: policy term (times its weight) + kl_coef * KL
  float grad_logp;       // d value / d logp with the log ratio held fixed
  float grad_log_ratio;  // d value / d log ratio
  float grad_alone;      // their sum were the token its ratio's only one, without cancellation
  float stats[kMetrics]; // clipped, clip low, clip high, dual clipped, ratio, KL, truncated
};

// rlk.native.policy_loss.token_terms for one real token. `log_ratio`: the token's, or its
// sequence's; `sequence`: VESPO's log sequence weight.
__device__ __forceinline__ Terms token_terms(const PolicyLossArgs& a, const Token& x,
                                             float log_ratio, float sequence) {
  const PolicyLossSettings& s = a.s;
  Terms r{};
  const bool passes = !(log_ratio < s.log_ratio_min || log_ratio > s.log_ratio_max);
  const float clamped = clamp(log_ratio, s.log_ratio_min, s.log_ratio_max);
  const float ratio = expf(clamped);
  bool truncated;
  const float weight = importance_weight(a, x, &truncated);
  const float lo = 1.0f - s.clip_low, hi = 1.0f + s.clip_high;
  float policy = 0.0f, policy_logp = 0.0f, through = 0.0f;
  float* st = r.stats;
  switch (s.objective) {
    case kPpo: {
      const bool capped_on = s.ratio_cap > 0.0f;
      const float capped = capped_on && ratio > s.ratio_cap ? s.ratio_cap : ratio;
      const float plain = -x.adv * capped;
      const float clipped = -x.adv * clamp(ratio, lo, hi);
      const bool took = clipped > plain;
      policy = max_nan(plain, clipped);
      // "not outside" so that a NaN ratio keeps its gradient (NaN) instead of a silent 0
      const bool inside = !(ratio < lo || ratio > hi);
      const bool below_cap = !capped_on || !(ratio > s.ratio_cap);
      through = -x.adv * ((took ? inside : below_cap) ? 1.0f : 0.0f);
      bool dual = false;
      if (s.dual_clip > 0.0f) {
        const float floor = -x.adv * s.dual_clip;
        dual = x.adv < 0.0f && policy > floor;
        policy = dual ? floor : policy;
        through = dual ? 0.0f : through;
      }
      st[0] = took ? 1.0f : 0.0f;
      st[1] = capped < lo && x.adv < 0.0f ? 1.0f : 0.0f;
      st[2] = capped > hi && x.adv > 0.0f ? 1.0f : 0.0f;
      st[3] = dual ? 1.0f : 0.0f;
      break;
    }
    case kCispo: {
      const float bounded = clamp(ratio, lo, hi);
      policy = -bounded * x.adv * x.logp;
      policy_logp = -bounded * x.adv;
      st[0] = ratio < lo || ratio > hi ? 1.0f : 0.0f;
      st[1] = ratio < lo && x.adv < 0.0f ? 1.0f : 0.0f;
      st[2] = ratio > hi && x.adv > 0.0f ? 1.0f : 0.0f;
      break;
    }
    case kSapo: {
      // the gate's derivative as sigmoid(z) * sigmoid(-z), not gate * (1 - gate), which
      // cancels to 0 near saturation; r - 1 as expm1 of the log ratio
      const float tau = x.adv > 0.0f ? s.sapo_temperature_pos : s.sapo_temperature_neg;
      const float z = tau * expm1f(clamped);
      const float gate = 1.0f / (1.0f + expf(-z));
      policy = -x.adv * gate * 4.0f / tau;
      through = -x.adv * 4.0f * gate * (1.0f / (1.0f + expf(z)));
      break;
    }
    default: {  // VESPO: phi of the sequence weight, detached; non-finite phi counts as 0
      const bool nonneg = x.adv >= 0.0f;
      const float k = nonneg ? s.vespo_k_pos : s.vespo_k_neg;
      const float lam = nonneg ? s.vespo_lambda_pos : s.vespo_lambda_neg;
      float phi = expf(lam + k * sequence - lam * expf(sequence));
      phi = isfinite(phi) ? phi : 0.0f;
      policy = -phi * x.adv * x.logp;
      policy_logp = -phi * x.adv;
    }
  }
  through = passes ? through * ratio : 0.0f;
  if (has_weight(a) && s.objective != kVespo) {
    policy *= weight;
    policy_logp *= weight;
    through *= weight;
  }
  float kl = 0.0f;
  r.value = policy;
  r.grad_logp = policy_logp;
  r.grad_alone = policy_logp + through;
  if (a.ref_logp.data != nullptr) {
    const float delta = x.logp - x.ref;
    // kl, its slope and `both` = slope + kl (rlk.native.policy_loss._kl): what kl * r has per
    // unit r when r is this token's ratio, written without cancellation (k3: delta exactly)
    float slope, both;
    switch (s.kl_estimator) {
      case kK1: kl = delta, slope = 1.0f, both = 1.0f + delta; break;
      case kK2: kl = 0.5f * delta * delta, slope = delta, both = delta * (1.0f + 0.5f * delta); break;
      case kK3: {
        const float back = expm1f(-delta);
        kl = back + delta, slope = -back, both = delta;
        break;
      }
      default:  // abs; torch.sign(NaN) is 0
        kl = fabsf(delta), slope = delta > 0.0f ? 1.0f : (delta < 0.0f ? -1.0f : 0.0f);
        both = slope + kl;
    }
    if (s.kl_clamp > 0.0f) {
      const bool inside = !(kl < -s.kl_clamp || kl > s.kl_clamp);
      kl = clamp(kl, -s.kl_clamp, s.kl_clamp);
      slope = inside ? slope : 0.0f;
      both = inside ? both : kl;
    }
    if (s.kl_straight_through) slope = delta, both = delta + kl;
    float kl_through = 0.0f, alone = slope;
    if (s.kl_bias_correction) {
      alone = (passes ? both : slope) * ratio;
      if (s.ratio_level != kSequenceRatio) {  // both derivatives land on this token
        slope = alone;
      } else {
        slope *= ratio;
        kl_through = passes ? kl * ratio : 0.0f;
      }
      kl *= ratio;
    }
    if (s.kl_coef != 0.0f) {  // else 0 * an overflowed KL (k3 past float32's range) is NaN
      r.value = policy + s.kl_coef * kl;
      r.grad_logp = policy_logp + s.kl_coef * slope;
      r.grad_alone += s.kl_coef * alone;
      // one rounding written out, never left to contraction: grad_kernel subtracts this very
      // value from the row's sum of it (the forward's and the backward's launches)
      through = fmaf(s.kl_coef, kl_through, through);
    }
  }
  r.grad_log_ratio = through;
  st[4] = ratio;
  st[5] = kl;
  st[6] = truncated ? 1.0f : 0.0f;
  return r;
}

__device__ __forceinline__ bool needs_sequence(const PolicyLossSettings& s) {
  return s.ratio_level != kTokenRatio || s.objective == kVespo;
}

// The sequence's statistic (rlk.native.policy_loss.sequence_statistics), on every thread:
// the mean log ratio of a sequence-level ratio, VESPO's clamped log sequence weight.
__device__ float sequence_statistic(const PolicyLossArgs& a, int64_t b, double* scratch) {
  double v[2] = {0.0, 0.0};
  const bool vespo = a.s.objective == kVespo;
  for_each_real(a, b, [&](const Token& x, int64_t) {
    if (vespo) {
      v[0] += clamp(x.logp - x.old, -kVespoLogRatioBound, kVespoLogRatioBound);
      if (has_weight(a)) {
        bool truncated;
        v[0] += clamp(logf(importance_weight(a, x, &truncated)), kVespoLogWeightMin,
                      kVespoLogWeightMax);
      }
    } else {
      v[0] += static_cast<double>(x.logp - x.old);
    }
    v[1] += 1.0;
  });
  block_sum_array<kThreads>(v, scratch);
  if (vespo) return clamp(static_cast<float>(v[0]), kVespoLogWeightMin, kVespoLogWeightMax);
  return static_cast<float>(v[0] / fmax(v[1], 1.0));
}

__device__ __forceinline__ float token_log_ratio(const PolicyLossArgs& a, const Token& x,
                                                 float sequence) {
  return a.s.ratio_level == kTokenRatio || a.s.objective == kVespo ? x.logp - x.old : sequence;
}

// kThrough: the gradient follows at the exact sequence ratio, so the row also takes
// backward_rows_kernel's sum through the ratio. There a token's log ratio is the sequence's
// (never VESPO's), so the term `t` below is the one that kernel sums.
template <bool kThrough>
__global__ void __launch_bounds__(kThreads) forward_rows_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kWarps * kPolicyLossRowStats];
  const int64_t b = blockIdx.x;
  const float sequence = needs_sequence(a.s) ? sequence_statistic(a, b, scratch) : 0.0f;
  double v[kPolicyLossRowStats] = {};
  for_each_real(a, b, [&](const Token& x, int64_t) {
    const Terms t = token_terms(a, x, token_log_ratio(a, x, sequence), sequence);
    v[kTerm] += static_cast<double>(t.value);
    v[kTokens] += 1.0;
#pragma unroll
    for (int k = 0; k < kMetrics; ++k) v[kClipped + k] += static_cast<double>(t.stats[k]);
    if (kThrough) v[kThroughRatio] += static_cast<double>(t.grad_log_ratio);
  });
  block_sum_array<kThreads>(v, scratch);
  if (threadIdx.x == 0) {
    v[kSequence] = sequence;
#pragma unroll
    for (int k = 0; k < kPolicyLossRowStats; ++k) a.rows[b * kPolicyLossRowStats + k] = v[k];
  }
}

// The aggregation's divisor from the token count, sequence count and shape.
__device__ __forceinline__ double divisor(const PolicyLossArgs& a, double tokens,
                                          double nonempty) {
  if (a.s.divisor > 0.0) return a.s.divisor;
  const double sequences = a.s.count_empty_rows ? static_cast<double>(a.B) : nonempty;
  switch (a.s.agg) {
    case kTokenMean: return fmax(tokens, 1.0);
    case kTokenSum: return 1.0;
    case kSeqMeanTokenSumNorm: return fmax(sequences * static_cast<double>(a.T), 1.0);
    default: return fmax(sequences, 1.0);
  }
}

// The rows in a fixed order, the aggregation, the metrics: one block's work.
__device__ void loss_and_metrics(const PolicyLossArgs& a) {
  enum { kTotal, kAllTokens, kNonempty, kSums, kN = kSums + kMetrics };
  __shared__ double scratch[kWarps * kN];
  const bool sequence_clips = a.s.ratio_level != kTokenRatio;
  double v[kN] = {};
  for (int64_t b = threadIdx.x; b < a.B; b += kThreads) {
    const double* row = a.rows + b * kPolicyLossRowStats;
    const double tokens = row[kTokens];
    const bool mean_of_row = a.s.agg == kSeqMeanTokenMean;
    v[kTotal] += mean_of_row ? (tokens > 0.0 ? row[kTerm] / tokens : 0.0) : row[kTerm];
    v[kAllTokens] += tokens;
    v[kNonempty] += tokens > 0.0 ? 1.0 : 0.0;
#pragma unroll
    for (int k = 0; k < kMetrics; ++k) {
      const bool per_sequence = sequence_clips && k < 4;  // clip statistics, per sequence
      const double value = row[kClipped + k];
      v[kSums + k] += per_sequence ? (tokens > 0.0 ? value / tokens : 0.0) : value;
    }
  }
  block_sum_array<kThreads>(v, scratch);
  // thread 0 writes the loss, thread 1 + k metric k: one division each, so that no sum stays
  // live across a division's slow path (in grad_kernel that spilled them all)
  if (threadIdx.x == 0) {
    *a.loss = static_cast<float>(a.s.scale * v[kTotal] / divisor(a, v[kAllTokens], v[kNonempty]));
    return;
  }
  const int metric = static_cast<int>(threadIdx.x) - 1;
  if (metric >= kMetrics) return;
  double sum = 0.0, count = 0.0;
#pragma unroll
  for (int k = 0; k < kMetrics; ++k) {  // select, not index: v stays in registers
    if (k != metric) continue;
    sum = v[kSums + k];
    count = sequence_clips && k < 4 ? v[kNonempty] : v[kAllTokens];
  }
  a.metrics[metric] = static_cast<float>(sum / fmax(count, 1.0));
}

__global__ void __launch_bounds__(kThreads) forward_final_kernel(PolicyLossArgs a) {
  loss_and_metrics(a);
}

// Backward, pass 1: each sequence's token count, its statistic and, for the exact sequence
// ratio, the sum of its terms' derivatives through the ratio.
__global__ void __launch_bounds__(kThreads) backward_rows_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kWarps * 2];
  const int64_t b = blockIdx.x;
  const float sequence = needs_sequence(a.s) ? sequence_statistic(a, b, scratch) : 0.0f;
  const bool spread = a.s.ratio_level == kSequenceRatio;
  double v[2] = {0.0, 0.0};
  for_each_real(a, b, [&](const Token& x, int64_t) {
    v[0] += 1.0;
    if (spread) v[1] += static_cast<double>(token_terms(a, x, sequence, sequence).grad_log_ratio);
  });
  block_sum_array<kThreads>(v, scratch);
  if (threadIdx.x == 0) {
    double* row = a.rows + b * kPolicyLossRowStats;
    row[kTokens] = v[0];
    row[kSequence] = sequence;
    row[kThroughRatio] = v[1];
  }
}

// Backward, pass 2: every block reduces the counts (same order everywhere), then writes the
// gradient of its sequences, masked tokens included (as zeros). A forward that writes the
// gradient ends with this launch, its first block doing forward_final_kernel's work too.
__global__ void __launch_bounds__(kThreads) grad_kernel(PolicyLossArgs a) {
  __shared__ double scratch[kWarps * 2];
  double totals[2] = {0.0, 0.0};  // tokens, non-empty sequences
  for (int64_t b = threadIdx.x; b < a.B; b += kThreads) {
    const double tokens = a.rows[b * kPolicyLossRowStats + kTokens];
    totals[0] += tokens;
    totals[1] += tokens > 0.0 ? 1.0 : 0.0;
  }
  block_sum_array<kThreads>(totals, scratch);
  const double common = a.s.scale / divisor(a, totals[0], totals[1]);
  const float upstream = a.grad_loss != nullptr ? *a.grad_loss : 1.0f;
  const bool spread = a.s.ratio_level == kSequenceRatio;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    const double* row = a.rows + b * kPolicyLossRowStats;
    const double tokens = row[kTokens];
    const double per_row = a.s.agg == kSeqMeanTokenMean ? (tokens > 0.0 ? common / tokens : 0.0)
                                                        : common;
    const float weight = static_cast<float>(per_row);
    const float sequence = static_cast<float>(row[kSequence]);
    // the exact sequence ratio: d log ratio / d logp_t = 1 / L for each of the L real tokens.
    // A token takes its own terms (its own share through the ratio in the cancellation-free
    // grad_alone) and 1 / L of the others' through the ratio: the row's float64 sum less its
    // own (rlk.native.policy_loss._sequence_ratio_grad).
    const double count = fmax(tokens, 1.0);
    const float own_share = static_cast<float>(1.0 / count);
    for (int64_t t = threadIdx.x; t < a.T; t += kThreads) {
      const Token x = load_token(a, b, t);
      float grad = 0.0f;
      if (x.real) {
        const Terms terms = token_terms(a, x, token_log_ratio(a, x, sequence), sequence);
        if (spread) {
          const double others = row[kThroughRatio] - static_cast<double>(terms.grad_log_ratio);
          grad = weight * (terms.grad_logp * (1.0f - own_share) + terms.grad_alone * own_share)
                 + static_cast<float>(per_row * others / count);
        } else {
          grad = weight * terms.grad_alone;
        }
        grad *= upstream;
      }
      store(a.grad, a.grad_type, b * a.T + t, grad);
    }
  }
  if (a.loss != nullptr && blockIdx.x == 0) loss_and_metrics(a);
}

unsigned grad_blocks(int64_t B) {
  return B < kMaxGradBlocks ? static_cast<unsigned>(B) : kMaxGradBlocks;
}

}  // namespace

const char* policy_loss_forward(const PolicyLossArgs& a, void* stream) {
  if (a.B > 0x7fffffffLL) return "policy_loss: too many sequences";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.B > 0) {
    if (a.grad != nullptr && a.s.ratio_level == kSequenceRatio)
      forward_rows_kernel<true><<<static_cast<unsigned>(a.B), kThreads, 0, s>>>(a);
    else
      forward_rows_kernel<false><<<static_cast<unsigned>(a.B), kThreads, 0, s>>>(a);
    if (const char* e = last_error()) return e;
  }
  if (a.grad != nullptr && a.B > 0)
    grad_kernel<<<grad_blocks(a.B), kThreads, 0, s>>>(a);
  else
    forward_final_kernel<<<1, kThreads, 0, s>>>(a);
  return last_error();
}

const char* policy_loss_backward(const PolicyLossArgs& a, void* stream) {
  if (a.B == 0) return nullptr;
  if (a.B > 0x7fffffffLL) return "policy_loss: too many sequences";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  backward_rows_kernel<<<static_cast<unsigned>(a.B), kThreads, 0, s>>>(a);
  if (const char* e = last_error()) return e;
  grad_kernel<<<grad_blocks(a.B), kThreads, 0, s>>>(a);
  return last_error();
}

}  // namespace rlk
