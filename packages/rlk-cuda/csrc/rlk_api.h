// Host-side entry points of the kernel library: plain pointers and shapes, no Python, no torch.
// Every function returns nullptr on success or a static message describing the failure.
// No CUDA header here: the nanobind module compiles with the host compiler alone.
#pragma once

#include <cstdint>

namespace rlk {

enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct LogpFwdArgs {
  const void* logits;     // [M, V] with unit column stride
  int dtype;
  int64_t M, V, row_stride;
  const int64_t* tokens;  // [M]; nullptr = statistics only (the sampler's first pass)
  const int64_t* rows;    // [R] or nullptr (then R == M)
  int64_t R;
  float temperature;      // used when temp_rows is nullptr
  const float* temp_rows; // [M] per-row temperature or nullptr
  int64_t ignore_index;
  float* logp;            // [R] (stride logp_stride) or nullptr
  int64_t logp_stride;
  float* entropy;         // [R] or nullptr (no entropy)
  double* lse;            // [R] or nullptr: float64, so the backward keeps 1 - p of a dominant
                          // token (float32 cannot hold lse to that precision when x / T is large)
  float* stats;           // [2, R] (row max of raw logits, log of the shifted sum) or nullptr:
                          // the sampler's statistics pass (sample.cu) reads them back
  int nseg;               // logp_forward_segments(V)
  float* partial;         // [R, nseg, 3] scratch when nseg > 1 (from torch, not allocated here)
};

// One vocabulary chunk [N, C] of rows whose full width is vocab_total (linear_logp forward):
// the partial pass reduces the chunk into partial[:, chunk]; the merge pass combines all chunks.
struct LogpColsArgs {
  const void* logits;     // [N, C] unit column stride (partial pass only)
  int dtype;
  int64_t N, C, row_stride;
  int64_t col_offset, vocab_total;
  const int64_t* tokens;  // [N] global vocabulary ids
  float temperature;
  const float* temp_rows; // [N] or nullptr
  int64_t ignore_index;
  int chunk, nchunks;
  float* partial;         // [N, nchunks, 3]
  float* tok_logit;       // [N] raw logit of each row's token (written by its chunk)
  float* logp;            // [N] (merge)
  float* entropy;         // [N] or nullptr: also selects the entropy statistics
  double* lse;            // [N] (merge): float64, as the logp backward kernel reads it
};

// Soft-capping of a float32 logits chunk [N, C] (the linear ops, rlk.lm_head): with grad null,
// logits become tanh(logits / softcap) in place; else grad (grad_dtype) is multiplied by the
// slope (1 - x^2) / softcap of those capped logits x, turning d/dx into d/d(raw logits).
struct SoftCapArgs {
  float* logits;
  int64_t N, C, row_stride;
  float softcap;
  void* grad;
  int grad_dtype;
  int64_t grad_row_stride;
};

// A row chunk of float32 logits [N, V] of linear_policy_loss (linear_policy_loss.cu): each row's
// logp, entropy and lse, and out = its logits gradient divided by -(g / T) * scale, where g is
// d loss / d logp of the row (known only after logp): e_j = exp(x_j / T - m) with the token's
// entry less exp(lse - m); the offset m is the token's x / T (scale = p_tok) or, when p_tok is
// below 2^-100, the row max / T. Ignored rows: zeros, scale 0; tokens outside
// [0, V) or rows without a finite max: zeros, NaN scale (and NaN logp).
struct RelProbArgs {
  const float* logits;    // [N, V], rows on 16-byte boundaries
  int64_t N, V, row_stride;
  void* out;              // [N, V] in out_dtype (kF32 or kBF16), rows on 16-byte boundaries
  int out_dtype;
  int64_t out_row_stride;
  const int64_t* tokens;  // [N]
  float temperature;
  const float* temp_rows; // [N] or nullptr
  int64_t ignore_index;
  int nseg;               // blocks per row, 1 to 64: relative_probs_segments(V) by default
  float* partial;         // [N, nseg, 3] scratch
  float* logp;            // [N]
  float* entropy;         // [N]
  double* lse;            // [N]
  float* scale;           // [N]
};

enum GroupAdvNormalize : int { kNormalizeStd = 0, kNormalizeBatchStd = 1, kNormalizeNone = 2 };
struct GroupAdvArgs {
  const float* rewards;     // [N]
  const int64_t* group_ids; // [N] non-decreasing in [0, num_groups), or nullptr: consecutive
                            // groups
  const int64_t* order;     // [N] with group_ids: rewards[order[i]] has group_ids[i]
  int64_t N, num_groups;
  int64_t group_size;       // > 0 when group_ids is nullptr
  int normalize;            // GroupAdvNormalize
  bool leave_one_out;
  bool nan_ignore;          // NaN rewards: left out of the statistics, advantage 0
  bool singleton_reward;    // a group of one: baseline 0 and std 1 (verl) instead of 0
  float eps;
  float* out;               // [N]
  double* batch_std;        // [1] scratch (kNormalizeBatchStd only)
};

struct LogpBwdArgs {
  const void* logits;     // [M, V] unit column stride
  int dtype;
  int64_t M, V, row_stride;
  void* grad;             // [M, V] in grad_dtype; may alias logits (same dtype and strides)
  int grad_dtype;         // dtype, or kBF16/kF16 for float32 logits (the linear ops' GEMM input)
  int64_t grad_row_stride;
  const int64_t* tokens;  // [M]
  const float* g_logp;    // [M]
  const float* g_ent;     // [M] or nullptr
  const double* lse;      // [M], as the forward wrote it
  const float* entropy;   // [M] or nullptr (needed when g_ent is given)
  float temperature;
  const float* temp_rows; // [M] or nullptr
  int64_t ignore_index;
  int64_t col_offset;     // global vocabulary id of column 0 (vocabulary chunks)
  int64_t vocab_total;    // tokens outside [0, vocab_total) give NaN gradients
};

struct SampleArgs {
  const void* logits;     // [B, V] unit column stride
  int dtype;
  int64_t B, V, row_stride;
  float temperature;      // 0 = greedy
  int64_t top_k;
  float top_p, min_p;
  const int64_t* seeds;   // [B]
  // sample() first runs the logp forward's statistics pass into `stats` (scratch), exactly as
  // logp_forward(tokens=nullptr) would at this temperature (1 when greedy), so that logp
  // equals that forward's bit for bit: with nseg = logp_forward_segments(V) and, where
  // nseg > 1, partial [B, nseg, 3]; or with tma, logp_forward_tma's segments and partial.
  float* stats;           // [2, B]
  int nseg;
  float* partial;
  bool tma;
  int64_t* tokens;        // [B]
  float* logp;            // [B]
  float* processed_logp;  // [B]
};

// policy_loss. Every tensor is contiguous and may have any of these element types (the
// kernel reads each in its own type and computes in float32); the gradient is written in
// logp's type.
enum ElemType : int {
  kElemF32 = 0, kElemBF16 = 1, kElemF16 = 2, kElemF64 = 3,
  kElemU8 = 4,  // bool and uint8
  kElemI8 = 5, kElemI16 = 6, kElemI32 = 7, kElemI64 = 8,
};
struct Operand {
  const void* data;  // nullptr: absent
  int type;          // ElemType
};

// rlk.PolicyLossOptions as the kernels take it (choices as indices into the option's tuple);
// rlk_cuda.policy_loss.settings sets every field, so no default lives here. "None" options are
// encoded as 0 (dual_clip, ratio_cap, kl_clamp, tis_cap, divisor) or as -inf / +inf
// (log_ratio_min / log_ratio_max).
struct PolicyLossSettings {
  int objective;              // ppo, cispo, sapo, vespo
  int ratio_level;            // token, sequence, sequence-token
  float clip_low, clip_high;
  float dual_clip, ratio_cap;
  float log_ratio_min, log_ratio_max;
  float sapo_temperature_pos, sapo_temperature_neg;
  float vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;
  float kl_coef;
  int kl_estimator;           // k1, k2, k3, abs (the value)
  bool kl_straight_through;   // the gradient is k2's ("k3+")
  float kl_clamp;
  bool kl_bias_correction;
  float tis_cap;
  int agg;                    // token-mean, token-sum, seq-mean-token-mean, seq-mean-token-sum,
                              // seq-mean-token-sum-norm
  double divisor;
  bool count_empty_rows;
  double scale;
};

constexpr int kPolicyLossRowStats = 11;  // float64 scratch per sequence: rows is [B, 11]
struct PolicyLossArgs {
  Operand logp;               // [B, T]
  Operand old_logp;           // [B, T]
  Operand advantages;         // [B], or [B, T] when adv_per_token
  Operand mask;               // [B, T], nonzero = a real token
  Operand ref_logp;           // [B, T] or absent (no KL)
  Operand rollout_logp;       // [B, T] or absent (no TIS weight)
  Operand importance_weights; // [B], [B, T] when weights_per_token, or absent
  int64_t B, T;
  bool adv_per_token, weights_per_token;
  PolicyLossSettings s;
  double* rows;               // [B, kPolicyLossRowStats] scratch
  float* loss;                // forward: 0-d
  float* metrics;             // forward: [7], rlk.ops.policy_loss_options.METRICS
  const float* grad_loss;     // 0-d upstream gradient; nullptr: 1 (forward with grad)
  void* grad;                 // backward: [B, T]; forward: [B, T] or nullptr (no gradient)
  int grad_type;              // ElemType of grad: logp's in the backward, float32 forward
};

// A contiguous tensor multiplied in place by *factor, a float32 on the device
// (linear_policy_loss_scale.cu).
struct ScaleArgs {
  void* data;
  int dtype;
  int64_t n;
  const float* factor;
};

// Rows [rows, cols] (unit column stride) times one float32 factor each, into another dtype;
// zeros where the factor is 0 (linear_policy_loss_scale.cu).
struct ScaleRowsArgs {
  const void* src;
  int src_dtype;
  int64_t src_row_stride;
  void* out;
  int out_dtype;
  int64_t out_row_stride;
  int64_t rows, cols;
  const float* factor;  // [rows]
};

// `stream` is a cudaStream_t (hipStream_t) passed as an opaque pointer.
const char* select_device(int device);
int logp_forward_segments(int64_t V);  // row segments of the forward (depends on V only)
const char* logp_forward(const LogpFwdArgs& a, void* stream);
// The same forward through Hopper's bulk copy engine (logp_tma.cu): always split in
// logp_forward_tma_segments(V) segments (a.partial required); runs on sm_90 devices only and
// exists only when the build has sm_90a code (logp_tma_built()).
bool logp_tma_built();
int logp_forward_tma_segments(int64_t V);
const char* logp_forward_tma(const LogpFwdArgs& a, void* stream);
const char* logp_backward(const LogpBwdArgs& a, void* stream);
const char* logp_cols_partial(const LogpColsArgs& a, void* stream);
const char* logp_cols_merge(const LogpColsArgs& a, void* stream);
const char* soft_cap(const SoftCapArgs& a, void* stream);
int relative_probs_segments(int64_t V);
const char* relative_probs(const RelProbArgs& a, void* stream);
const char* group_advantages(const GroupAdvArgs& a, void* stream);
// No work when *factor is exactly 1: the check happens on the device, the host never waits.
const char* scale_by_device_factor(const ScaleArgs& a, void* stream);
const char* scale_rows(const ScaleRowsArgs& a, void* stream);
const char* sample(const SampleArgs& a, void* stream);  // the statistics pass, then the draw
// The forward writes loss and metrics, and grad too when given: d loss / d logp at upstream
// grad_loss, exactly what policy_loss_backward writes (its rows come from the forward's pass).
const char* policy_loss_forward(const PolicyLossArgs& a, void* stream);
const char* policy_loss_backward(const PolicyLossArgs& a, void* stream);

}  // namespace rlk
