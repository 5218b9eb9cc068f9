// Host-side entry points of the kernel library: plain pointers and shapes, no Python, no torch.
// Every function returns nullptr on success or a static message describing the failure.
// No CUDA header here: the nanobind module compiles with the host compiler alone.
#pragma once

#include <cstdint>

namespace rlk {

// Element types, one code each: the logits kernels take the first three, policy_loss any (bool
// is stored as uint8). The Python wrappers read these codes from the extension (_C.DType).
enum DType : int {
  kF32 = 0, kBF16 = 1, kF16 = 2, kF64 = 3,
  kU8 = 4,  // bool and uint8
  kI8 = 5, kI16 = 6, kI32 = 7, kI64 = 8,
};

// Every argument struct is written as one field list, F(type, name): it declares the struct's
// fields here and, in bindings.cpp, the Python class filled by field name, so that each name
// is written once in C++. Comments inside a list are /* */: a // comment would swallow the
// line continuation.
#define RLK_DECLARE_FIELD(type, name) type name;

#define RLK_LOGP_FWD_ARGS(F)                                                                   \
  F(const void*, logits)     /* [M, V] with unit column stride */                              \
  F(int, dtype)                                                                                \
  F(int64_t, M) F(int64_t, V) F(int64_t, row_stride)                                           \
  F(const int64_t*, tokens)  /* [M]; nullptr = statistics only (the sampler's first pass) */   \
  F(const int64_t*, rows)    /* [R] or nullptr (then R == M) */                                \
  F(int64_t, R)                                                                                \
  F(float, temperature)      /* used when temp_rows is nullptr */                              \
  F(const float*, temp_rows) /* [M] per-row temperature or nullptr */                          \
  F(int64_t, ignore_index)                                                                     \
  F(float*, logp)            /* [R] (stride logp_stride) or nullptr */                         \
  F(int64_t, logp_stride)                                                                      \
  F(float*, entropy)         /* [R] or nullptr (no entropy) */                                 \
  /* float64, so the backward keeps 1 - p of a dominant token (float32 cannot hold lse to   */ \
  /* that precision when x / T is large) */                                                    \
  F(double*, lse)            /* [R] or nullptr */                                              \
  F(int, nseg)               /* logp_forward_segments(V) */                                    \
  F(float*, partial)         /* [R, nseg, 3] scratch when nseg > 1 (from torch) */
struct LogpFwdArgs {
  RLK_LOGP_FWD_ARGS(RLK_DECLARE_FIELD)
  // [2, R] (row max of raw logits, log of the shifted sum) or nullptr: only the sampler's
  // statistics pass (sample.cu) sets it and reads them back, so it is no bound field
  float* stats = nullptr;
};

// One vocabulary chunk [N, C] of rows whose full width is vocab_total (linear_logp forward):
// the partial pass reduces the chunk into partial[:, chunk]; the merge pass combines all chunks.
#define RLK_LOGP_COLS_ARGS(F)                                                                  \
  F(const void*, logits)     /* [N, C] unit column stride (partial pass only) */               \
  F(int, dtype)                                                                                \
  F(int64_t, N) F(int64_t, C) F(int64_t, row_stride)                                           \
  F(int64_t, col_offset) F(int64_t, vocab_total)                                               \
  F(const int64_t*, tokens)  /* [N] global vocabulary ids */                                   \
  F(float, temperature)                                                                        \
  F(const float*, temp_rows) /* [N] or nullptr */                                              \
  F(int64_t, ignore_index)                                                                     \
  F(int, chunk) F(int, nchunks)                                                                \
  F(float*, partial)         /* [N, nchunks, 3] */                                             \
  F(float*, tok_logit)       /* [N] raw logit of each row's token (written by its chunk) */    \
  F(float*, logp)            /* [N] (merge) */                                                 \
  F(float*, entropy)         /* [N] or nullptr: also selects the entropy statistics */         \
  F(double*, lse)            /* [N] (merge): float64, as the logp backward kernel reads it */
struct LogpColsArgs { RLK_LOGP_COLS_ARGS(RLK_DECLARE_FIELD) };

// Soft-capping of a float32 logits chunk [N, C] (the linear ops, rlk.lm_head): with grad null,
// logits become tanh(logits / softcap) in place; else grad (grad_dtype) is multiplied by the
// slope (1 - x^2) / softcap of those capped logits x, turning d/dx into d/d(raw logits).
#define RLK_SOFT_CAP_ARGS(F)                                                                   \
  F(float*, logits)                                                                            \
  F(int64_t, N) F(int64_t, C) F(int64_t, row_stride)                                           \
  F(float, softcap)                                                                            \
  F(void*, grad)                                                                               \
  F(int, grad_dtype)                                                                           \
  F(int64_t, grad_row_stride)
struct SoftCapArgs { RLK_SOFT_CAP_ARGS(RLK_DECLARE_FIELD) };

// A row chunk of float32 logits [N, V] of linear_policy_loss (linear_policy_loss.cu): each row's
// logp, entropy and lse, and out = its logits gradient divided by -(g / T) * scale, where g is
// d loss / d logp of the row (known only after logp): e_j = exp(x_j / T - m) with the token's
// entry less exp(lse - m); the offset m is the token's x / T (scale = p_tok) or, when p_tok is
// below 2^-100, the row max / T. Ignored rows: zeros, scale 0; tokens outside
// [0, V) or rows without a finite max: zeros, NaN scale (and NaN logp).
#define RLK_REL_PROB_ARGS(F)                                                                   \
  F(const float*, logits)    /* [N, V], rows on 16-byte boundaries */                          \
  F(int64_t, N) F(int64_t, V) F(int64_t, row_stride)                                           \
  F(void*, out)              /* [N, V] in out_dtype (kF32 or kBF16), rows on 16-byte boundaries */ \
  F(int, out_dtype)                                                                            \
  F(int64_t, out_row_stride)                                                                   \
  F(const int64_t*, tokens)  /* [N] */                                                         \
  F(float, temperature)                                                                        \
  F(const float*, temp_rows) /* [N] or nullptr */                                              \
  F(int64_t, ignore_index)                                                                     \
  F(int, nseg)               /* blocks per row, 1 to 64: relative_probs_segments(V) by default */ \
  F(float*, partial)         /* [N, nseg, 3] scratch */                                        \
  F(float*, logp)            /* [N] */                                                         \
  F(float*, entropy)         /* [N] */                                                         \
  F(double*, lse)            /* [N] */                                                         \
  F(float*, scale)           /* [N] */
struct RelProbArgs { RLK_REL_PROB_ARGS(RLK_DECLARE_FIELD) };

enum GroupAdvNormalize : int { kNormalizeStd = 0, kNormalizeBatchStd = 1, kNormalizeNone = 2 };
#define RLK_GROUP_ADV_ARGS(F)                                                                  \
  F(const float*, rewards)     /* [N] */                                                       \
  /* [N] non-decreasing in [0, num_groups), or nullptr: consecutive groups */                  \
  F(const int64_t*, group_ids)                                                                 \
  F(const int64_t*, order)     /* [N] with group_ids: rewards[order[i]] has group_ids[i] */    \
  F(int64_t, N) F(int64_t, num_groups)                                                         \
  F(int64_t, group_size)       /* > 0 when group_ids is nullptr */                             \
  F(int, normalize)            /* GroupAdvNormalize */                                         \
  F(bool, leave_one_out)                                                                       \
  F(bool, nan_ignore)          /* NaN rewards: left out of the statistics, advantage 0 */      \
  F(bool, singleton_reward)    /* a group of one: baseline 0 and std 1 (verl) instead of 0 */  \
  F(float, eps)                                                                                \
  F(float*, out)               /* [N] */                                                       \
  F(double*, batch_std)        /* [1] scratch (kNormalizeBatchStd only) */
struct GroupAdvArgs { RLK_GROUP_ADV_ARGS(RLK_DECLARE_FIELD) };

#define RLK_LOGP_BWD_ARGS(F)                                                                   \
  F(const void*, logits)     /* [M, V] unit column stride */                                   \
  F(int, dtype)                                                                                \
  F(int64_t, M) F(int64_t, V) F(int64_t, row_stride)                                           \
  F(void*, grad)             /* [M, V] in grad_dtype; may alias logits (same dtype, strides) */ \
  /* dtype, or kBF16/kF16 for float32 logits (the linear ops' GEMM input) */                   \
  F(int, grad_dtype)                                                                           \
  F(int64_t, grad_row_stride)                                                                  \
  F(const int64_t*, tokens)  /* [M] */                                                         \
  F(const float*, g_logp)    /* [M] */                                                         \
  F(const float*, g_ent)     /* [M] or nullptr */                                              \
  F(const double*, lse)      /* [M], as the forward wrote it */                                \
  F(const float*, entropy)   /* [M] or nullptr (needed when g_ent is given) */                 \
  F(float, temperature)                                                                        \
  F(const float*, temp_rows) /* [M] or nullptr */                                              \
  F(int64_t, ignore_index)                                                                     \
  F(int64_t, col_offset)     /* global vocabulary id of column 0 (vocabulary chunks) */        \
  F(int64_t, vocab_total)    /* tokens outside [0, vocab_total) give NaN gradients */
struct LogpBwdArgs { RLK_LOGP_BWD_ARGS(RLK_DECLARE_FIELD) };

// sample() first runs the logp forward's statistics pass into `stats` (scratch), exactly as
// logp_forward(tokens=nullptr) would at this temperature (1 when greedy), so that logp
// equals that forward's bit for bit: with nseg = logp_forward_segments(V) and, where
// nseg > 1, partial [B, nseg, 3]; or with tma, logp_forward_tma's segments and partial.
#define RLK_SAMPLE_ARGS(F)                                                                     \
  F(const void*, logits)     /* [B, V] unit column stride */                                   \
  F(int, dtype)                                                                                \
  F(int64_t, B) F(int64_t, V) F(int64_t, row_stride)                                           \
  F(float, temperature)      /* 0 = greedy */                                                  \
  F(int64_t, top_k)                                                                            \
  F(float, top_p) F(float, min_p)                                                              \
  F(const int64_t*, seeds)   /* [B] */                                                         \
  F(float*, stats)           /* [2, B] */                                                      \
  F(int, nseg)                                                                                 \
  F(float*, partial)                                                                           \
  F(bool, tma)                                                                                 \
  F(int64_t*, tokens)        /* [B] */                                                         \
  F(float*, logp)            /* [B] */                                                         \
  F(float*, processed_logp)  /* [B] */
struct SampleArgs { RLK_SAMPLE_ARGS(RLK_DECLARE_FIELD) };

// policy_loss. Every tensor is contiguous and may have any DType (the kernel reads each in its
// own type and computes in float32); the gradient is written in logp's type.
#define RLK_OPERAND(F)                                                                         \
  F(const void*, data)       /* nullptr: absent */                                             \
  F(int, type)               /* DType */
struct Operand { RLK_OPERAND(RLK_DECLARE_FIELD) };

// rlk.PolicyLossOptions as the kernels take it (choices as indices into the option's tuple);
// rlk_cuda.policy_loss.settings sets every field, so no default lives here. "None" options are
// encoded as 0 (dual_clip, ratio_cap, kl_clamp, tis_cap, divisor) or as -inf / +inf
// (log_ratio_min / log_ratio_max).
#define RLK_POLICY_LOSS_SETTINGS(F)                                                            \
  F(int, objective)                /* ppo, cispo, sapo, vespo */                               \
  F(int, ratio_level)              /* token, sequence, sequence-token */                       \
  F(float, clip_low) F(float, clip_high)                                                       \
  F(float, dual_clip) F(float, ratio_cap)                                                      \
  F(float, log_ratio_min) F(float, log_ratio_max)                                              \
  F(float, sapo_temperature_pos) F(float, sapo_temperature_neg)                                \
  F(float, vespo_k_pos) F(float, vespo_lambda_pos)                                             \
  F(float, vespo_k_neg) F(float, vespo_lambda_neg)                                             \
  F(float, kl_coef)                                                                            \
  F(int, kl_estimator)             /* k1, k2, k3, abs (the value) */                           \
  F(bool, kl_straight_through)     /* the gradient is k2's ("k3+") */                          \
  F(float, kl_clamp)                                                                           \
  F(bool, kl_bias_correction)                                                                  \
  F(float, tis_cap)                                                                            \
  /* token-mean, token-sum, seq-mean-token-mean, seq-mean-token-sum, */                        \
  /* seq-mean-token-sum-norm */                                                                \
  F(int, agg)                                                                                  \
  F(double, divisor)                                                                           \
  F(bool, count_empty_rows)                                                                    \
  F(double, scale)
struct PolicyLossSettings { RLK_POLICY_LOSS_SETTINGS(RLK_DECLARE_FIELD) };

constexpr int kPolicyLossRowStats = 11;  // float64 scratch per sequence: rows is [B, 11]
#define RLK_POLICY_LOSS_ARGS(F)                                                                \
  F(Operand, logp)                 /* [B, T] */                                                \
  F(Operand, old_logp)             /* [B, T] */                                                \
  F(Operand, advantages)           /* [B], or [B, T] when adv_per_token */                     \
  F(Operand, mask)                 /* [B, T], nonzero = a real token */                        \
  F(Operand, ref_logp)             /* [B, T] or absent (no KL) */                              \
  F(Operand, rollout_logp)         /* [B, T] or absent (no TIS weight) */                      \
  F(Operand, importance_weights)   /* [B], [B, T] when weights_per_token, or absent */         \
  F(int64_t, B) F(int64_t, T)                                                                  \
  F(bool, adv_per_token) F(bool, weights_per_token)                                            \
  F(PolicyLossSettings, s)                                                                     \
  F(double*, rows)                 /* [B, kPolicyLossRowStats] scratch */                      \
  F(float*, loss)                  /* forward: 0-d */                                          \
  F(float*, metrics)               /* forward: [7], rlk.ops.policy_loss_options.METRICS */     \
  F(const float*, grad_loss)       /* 0-d upstream gradient; nullptr: 1 (forward with grad) */ \
  F(void*, grad)                   /* backward: [B, T]; forward: [B, T] or nullptr (no grad) */ \
  F(int, grad_type)                /* DType of grad: logp's in the backward, float32 forward */
struct PolicyLossArgs { RLK_POLICY_LOSS_ARGS(RLK_DECLARE_FIELD) };

// A contiguous tensor multiplied in place by *factor, a float32 on the device
// (linear_policy_loss_scale.cu).
#define RLK_SCALE_ARGS(F)                                                                      \
  F(void*, data)                                                                               \
  F(int, dtype)                                                                                \
  F(int64_t, n)                                                                                \
  F(const float*, factor)
struct ScaleArgs { RLK_SCALE_ARGS(RLK_DECLARE_FIELD) };

// Rows [rows, cols] (unit column stride) times one float32 factor each, into another dtype;
// zeros where the factor is 0 (linear_policy_loss_scale.cu).
#define RLK_SCALE_ROWS_ARGS(F)                                                                 \
  F(const void*, src)                                                                          \
  F(int, src_dtype)                                                                            \
  F(int64_t, src_row_stride)                                                                   \
  F(void*, out)                                                                                \
  F(int, out_dtype)                                                                            \
  F(int64_t, out_row_stride)                                                                   \
  F(int64_t, rows) F(int64_t, cols)                                                            \
  F(const float*, factor)    /* [rows] */
struct ScaleRowsArgs { RLK_SCALE_ROWS_ARGS(RLK_DECLARE_FIELD) };

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
