// Python module rlk_cuda._C: validated raw pointers and shapes in, exceptions out.
// The Python wrappers (rlk_cuda.logp, rlk_cuda.sample) check dtypes, shapes and devices and
// pass the caller's current stream; this layer only guards against null pointers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "rlk_api.h"

// rlk-rocm compiles this file too, under its own name.
#ifndef RLK_EXT_NAME
#define RLK_EXT_NAME "rlk_cuda"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T> T* ptr(uintptr_t p) { return reinterpret_cast<T*>(p); }

void prepare(int device) {
  const char* e = rlk::select_device(device);
  if (e != nullptr)
    throw std::runtime_error(std::string(RLK_EXT_NAME ": cannot select device ") +
                             std::to_string(device) + ": " + e);
}

void check(const char* err) {
  if (err != nullptr) throw std::runtime_error(std::string(RLK_EXT_NAME ": kernel launch failed: ") + err);
}

void require(uintptr_t p, const char* what) {
  if (p == 0) throw std::invalid_argument(std::string(RLK_EXT_NAME ": null pointer for ") + what);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = RLK_EXT_NAME " kernels (raw-pointer interface; use the Python wrappers)";
  m.attr("ARCHITECTURES") = RLK_CUDA_ARCHS;

  m.attr("TMA_BUILT") = rlk::logp_tma_built();

  // tma=true takes the Hopper bulk-copy path (logp_tma.cu); nseg must then be its segments.
  m.def("logp_forward",
        [](int device, uintptr_t stream, uintptr_t logits, int dtype, int64_t M, int64_t V,
           int64_t row_stride, uintptr_t tokens, uintptr_t rows, int64_t R, float temperature,
           uintptr_t temp_rows, int64_t ignore_index, uintptr_t logp, int64_t logp_stride,
           uintptr_t entropy, uintptr_t lse, int nseg, uintptr_t partial, bool tma) {
          if (R > 0 && V > 0) require(logits, "logits");
          prepare(device);
          rlk::LogpFwdArgs a{ptr<const void>(logits), dtype, M, V, row_stride,
                             ptr<const int64_t>(tokens), ptr<const int64_t>(rows), R, temperature,
                             ptr<const float>(temp_rows), ignore_index, ptr<float>(logp),
                             logp_stride, ptr<float>(entropy), ptr<double>(lse), nullptr, nseg,
                             ptr<float>(partial)};
          void* s = reinterpret_cast<void*>(stream);
          check(tma ? rlk::logp_forward_tma(a, s) : rlk::logp_forward(a, s));
        },
        nb::kw_only(), "device"_a, "stream"_a, "logits"_a, "dtype"_a, "M"_a, "V"_a, "row_stride"_a,
        "tokens"_a, "rows"_a, "R"_a, "temperature"_a, "temp_rows"_a, "ignore_index"_a, "logp"_a,
        "logp_stride"_a, "entropy"_a, "lse"_a, "nseg"_a, "partial"_a, "tma"_a);

  m.def("logp_forward_segments", &rlk::logp_forward_segments,
        "Row segments the forward uses for vocabulary size V (scratch: R * segments * 3 floats)");
  m.def("logp_forward_tma_segments", &rlk::logp_forward_tma_segments,
        "Row segments of the bulk-copy forward for vocabulary size V (always needs scratch)");

  m.def("logp_backward",
        [](int device, uintptr_t stream, uintptr_t logits, int dtype, int64_t M, int64_t V,
           int64_t row_stride, uintptr_t grad, int grad_dtype, int64_t grad_row_stride,
           uintptr_t tokens,
           uintptr_t g_logp, uintptr_t g_ent, uintptr_t lse, uintptr_t entropy, float temperature,
           uintptr_t temp_rows, int64_t ignore_index, int64_t col_offset, int64_t vocab_total) {
          if (M > 0 && V > 0) {
            require(logits, "logits");
            require(grad, "grad");
            require(tokens, "tokens");
            require(g_logp, "grad_logp");
            require(lse, "lse");
          }
          prepare(device);
          rlk::LogpBwdArgs a{ptr<const void>(logits), dtype, M, V, row_stride, ptr<void>(grad),
                             grad_dtype, grad_row_stride, ptr<const int64_t>(tokens),
                             ptr<const float>(g_logp),
                             ptr<const float>(g_ent), ptr<const double>(lse),
                             ptr<const float>(entropy), temperature, ptr<const float>(temp_rows),
                             ignore_index, col_offset, vocab_total};
          check(rlk::logp_backward(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "logits"_a, "dtype"_a, "M"_a, "V"_a, "row_stride"_a,
        "grad"_a, "grad_dtype"_a, "grad_row_stride"_a, "tokens"_a, "g_logp"_a, "g_ent"_a, "lse"_a,
        "entropy"_a, "temperature"_a, "temp_rows"_a, "ignore_index"_a, "col_offset"_a,
        "vocab_total"_a);

  // linear_logp forward over vocabulary chunks; phase 0 = one chunk's partials, 1 = merge.
  m.def("logp_cols",
        [](int phase, int device, uintptr_t stream, uintptr_t logits, int dtype, int64_t N,
           int64_t C, int64_t row_stride, int64_t col_offset, int64_t vocab_total,
           uintptr_t tokens, float temperature, uintptr_t temp_rows, int64_t ignore_index,
           int chunk, int nchunks, uintptr_t partial, uintptr_t tok_logit, uintptr_t logp,
           uintptr_t entropy, uintptr_t lse) {
          if (N > 0) {
            require(tokens, "tokens");
            require(partial, "partial");
            require(tok_logit, "tok_logit");
            if (phase == 0) require(logits, "logits");
            if (phase == 1) {
              require(logp, "logp");
              require(lse, "lse");
            }
          }
          prepare(device);
          rlk::LogpColsArgs a{ptr<const void>(logits), dtype, N, C, row_stride, col_offset,
                              vocab_total, ptr<const int64_t>(tokens), temperature,
                              ptr<const float>(temp_rows), ignore_index, chunk, nchunks,
                              ptr<float>(partial), ptr<float>(tok_logit), ptr<float>(logp),
                              ptr<float>(entropy), ptr<double>(lse)};
          void* s = reinterpret_cast<void*>(stream);
          check(phase == 0 ? rlk::logp_cols_partial(a, s) : rlk::logp_cols_merge(a, s));
        },
        nb::kw_only(), "phase"_a, "device"_a, "stream"_a, "logits"_a, "dtype"_a, "N"_a, "C"_a,
        "row_stride"_a, "col_offset"_a, "vocab_total"_a, "tokens"_a, "temperature"_a, "temp_rows"_a,
        "ignore_index"_a, "chunk"_a, "nchunks"_a, "partial"_a, "tok_logit"_a, "logp"_a, "entropy"_a,
        "lse"_a);

  // linear_policy_loss: a float32 logits chunk's statistics and relative probabilities.
  m.def("relative_probs_segments", &rlk::relative_probs_segments, nb::kw_only(), "V"_a);
  m.def("relative_probs",
        [](int device, uintptr_t stream, uintptr_t logits, int64_t N, int64_t V,
           int64_t row_stride, uintptr_t out, int out_dtype, int64_t out_row_stride,
           uintptr_t tokens, float temperature, uintptr_t temp_rows, int64_t ignore_index,
           int nseg, uintptr_t partial, uintptr_t logp, uintptr_t entropy, uintptr_t lse,
           uintptr_t scale) {
          if (N > 0) {
            require(logits, "logits");
            require(out, "out");
            require(tokens, "tokens");
            require(partial, "partial");
            require(logp, "logp");
            require(entropy, "entropy");
            require(lse, "lse");
            require(scale, "scale");
          }
          prepare(device);
          rlk::RelProbArgs a{ptr<const float>(logits), N, V, row_stride, ptr<void>(out),
                             out_dtype, out_row_stride, ptr<const int64_t>(tokens), temperature,
                             ptr<const float>(temp_rows), ignore_index, nseg,
                             ptr<float>(partial), ptr<float>(logp), ptr<float>(entropy),
                             ptr<double>(lse), ptr<float>(scale)};
          check(rlk::relative_probs(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "logits"_a, "N"_a, "V"_a, "row_stride"_a, "out"_a,
        "out_dtype"_a, "out_row_stride"_a, "tokens"_a, "temperature"_a, "temp_rows"_a,
        "ignore_index"_a, "nseg"_a, "partial"_a, "logp"_a, "entropy"_a, "lse"_a, "scale"_a);

  // A contiguous tensor times a float32 device scalar, in place (nothing to do when it is 1).
  m.def("scale_by_device_factor",
        [](int device, uintptr_t stream, uintptr_t data, int dtype, int64_t n, uintptr_t factor) {
          if (n > 0) {
            require(data, "data");
            require(factor, "factor");
          }
          prepare(device);
          rlk::ScaleArgs a{ptr<void>(data), dtype, n, ptr<const float>(factor)};
          check(rlk::scale_by_device_factor(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "data"_a, "dtype"_a, "n"_a, "factor"_a);

  // out[r, :] = src[r, :] * factor[r] in out's dtype, zeros where factor[r] is 0.
  m.def("scale_rows",
        [](int device, uintptr_t stream, uintptr_t src, int src_dtype, int64_t src_row_stride,
           uintptr_t out, int out_dtype, int64_t out_row_stride, int64_t rows, int64_t cols,
           uintptr_t factor) {
          if (rows > 0 && cols > 0) {
            require(src, "src");
            require(out, "out");
            require(factor, "factor");
          }
          prepare(device);
          rlk::ScaleRowsArgs a{ptr<const void>(src), src_dtype, src_row_stride, ptr<void>(out),
                               out_dtype, out_row_stride, rows, cols, ptr<const float>(factor)};
          check(rlk::scale_rows(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "src"_a, "src_dtype"_a, "src_row_stride"_a, "out"_a,
        "out_dtype"_a, "out_row_stride"_a, "rows"_a, "cols"_a, "factor"_a);

  // Soft cap of a float32 logits chunk in place (grad 0), or its chain rule into grad.
  m.def("soft_cap",
        [](int device, uintptr_t stream, uintptr_t logits, int64_t N, int64_t C,
           int64_t row_stride, float softcap, uintptr_t grad, int grad_dtype,
           int64_t grad_row_stride) {
          if (N > 0 && C > 0) require(logits, "logits");
          prepare(device);
          rlk::SoftCapArgs a{ptr<float>(logits), N, C, row_stride, softcap, ptr<void>(grad),
                             grad_dtype, grad_row_stride};
          check(rlk::soft_cap(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "logits"_a, "N"_a, "C"_a, "row_stride"_a,
        "softcap"_a, "grad"_a, "grad_dtype"_a, "grad_row_stride"_a);

  m.def(
      "group_advantages",
      [](int device, uintptr_t stream, uintptr_t rewards, uintptr_t group_ids, int64_t N,
         int64_t num_groups, int64_t group_size, int normalize, bool leave_one_out,
         bool nan_ignore, bool singleton_reward, float eps, uintptr_t out, uintptr_t order,
         uintptr_t batch_std) {
        if (N > 0) {
          require(rewards, "rewards");
          require(out, "out");
          if (group_ids != 0) {
            require(order, "order");
          } else if (group_size <= 0) {
            throw std::invalid_argument(RLK_EXT_NAME ": group_advantages needs group_ids or "
                                        "group_size > 0");
          }
          if (normalize == rlk::kNormalizeBatchStd) require(batch_std, "batch_std");
        }
        prepare(device);
        rlk::GroupAdvArgs a{ptr<const float>(rewards), ptr<const int64_t>(group_ids),
                            ptr<const int64_t>(order), N, num_groups, group_size, normalize,
                            leave_one_out, nan_ignore, singleton_reward, eps, ptr<float>(out),
                            ptr<double>(batch_std)};
        check(rlk::group_advantages(a, reinterpret_cast<void*>(stream)));
      },
      nb::kw_only(), "device"_a, "stream"_a, "rewards"_a, "group_ids"_a, "N"_a, "num_groups"_a,
      "group_size"_a, "normalize"_a, "leave_one_out"_a, "nan_ignore"_a, "singleton_reward"_a,
      "eps"_a, "out"_a, "order"_a, "batch_std"_a);

  // The statistics pass (the logp forward's, tma as for logp_forward) and the draw, in one
  // call: stats [2, B] and partial are scratch.
  m.def("sample",
        [](int device, uintptr_t stream, uintptr_t logits, int dtype, int64_t B, int64_t V,
           int64_t row_stride, float temperature, int64_t top_k, float top_p, float min_p,
           uintptr_t seeds, uintptr_t stats, int nseg, uintptr_t partial, bool tma,
           uintptr_t tokens, uintptr_t logp, uintptr_t processed_logp) {
          if (B > 0) {
            require(logits, "logits");
            require(seeds, "seeds");
            require(stats, "stats");
            require(tokens, "tokens");
            require(logp, "logp");
            require(processed_logp, "processed_logp");
          }
          prepare(device);
          rlk::SampleArgs a{ptr<const void>(logits), dtype, B, V, row_stride, temperature, top_k,
                            top_p, min_p, ptr<const int64_t>(seeds), ptr<float>(stats), nseg,
                            ptr<float>(partial), tma, ptr<int64_t>(tokens), ptr<float>(logp),
                            ptr<float>(processed_logp)};
          check(rlk::sample(a, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "logits"_a, "dtype"_a, "B"_a, "V"_a, "row_stride"_a,
        "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a, "seeds"_a, "stats"_a, "nseg"_a,
        "partial"_a, "tma"_a, "tokens"_a, "logp"_a, "processed_logp"_a);

  // policy_loss: the options as a settings struct (built once per options object), the
  // tensors as (pointer, element type) pairs; every argument by name.
  nb::class_<rlk::PolicyLossSettings>(m, "PolicyLossSettings")
      .def(nb::init<>())
      .def_rw("objective", &rlk::PolicyLossSettings::objective)
      .def_rw("ratio_level", &rlk::PolicyLossSettings::ratio_level)
      .def_rw("clip_low", &rlk::PolicyLossSettings::clip_low)
      .def_rw("clip_high", &rlk::PolicyLossSettings::clip_high)
      .def_rw("dual_clip", &rlk::PolicyLossSettings::dual_clip)
      .def_rw("ratio_cap", &rlk::PolicyLossSettings::ratio_cap)
      .def_rw("log_ratio_min", &rlk::PolicyLossSettings::log_ratio_min)
      .def_rw("log_ratio_max", &rlk::PolicyLossSettings::log_ratio_max)
      .def_rw("sapo_temperature_pos", &rlk::PolicyLossSettings::sapo_temperature_pos)
      .def_rw("sapo_temperature_neg", &rlk::PolicyLossSettings::sapo_temperature_neg)
      .def_rw("vespo_k_pos", &rlk::PolicyLossSettings::vespo_k_pos)
      .def_rw("vespo_lambda_pos", &rlk::PolicyLossSettings::vespo_lambda_pos)
      .def_rw("vespo_k_neg", &rlk::PolicyLossSettings::vespo_k_neg)
      .def_rw("vespo_lambda_neg", &rlk::PolicyLossSettings::vespo_lambda_neg)
      .def_rw("kl_coef", &rlk::PolicyLossSettings::kl_coef)
      .def_rw("kl_estimator", &rlk::PolicyLossSettings::kl_estimator)
      .def_rw("kl_straight_through", &rlk::PolicyLossSettings::kl_straight_through)
      .def_rw("kl_clamp", &rlk::PolicyLossSettings::kl_clamp)
      .def_rw("kl_bias_correction", &rlk::PolicyLossSettings::kl_bias_correction)
      .def_rw("tis_cap", &rlk::PolicyLossSettings::tis_cap)
      .def_rw("agg", &rlk::PolicyLossSettings::agg)
      .def_rw("divisor", &rlk::PolicyLossSettings::divisor)
      .def_rw("count_empty_rows", &rlk::PolicyLossSettings::count_empty_rows)
      .def_rw("scale", &rlk::PolicyLossSettings::scale);
  m.attr("POLICY_LOSS_ROW_STATS") = rlk::kPolicyLossRowStats;
  // backward=false writes loss and metrics, and grad when given (float32, at upstream 1 unless
  // grad_loss is given); backward=true writes grad in logp's element type.
  m.def(
      "policy_loss",
      [](bool backward, int device, uintptr_t stream, uintptr_t logp, int logp_type,
         uintptr_t old_logp, int old_logp_type, uintptr_t advantages, int advantages_type,
         uintptr_t mask, int mask_type, uintptr_t ref_logp, int ref_logp_type,
         uintptr_t rollout_logp, int rollout_logp_type, uintptr_t importance_weights,
         int importance_weights_type, int64_t B, int64_t T, bool adv_per_token,
         bool weights_per_token, const rlk::PolicyLossSettings& settings, uintptr_t rows,
         uintptr_t loss, uintptr_t metrics, uintptr_t grad_loss, uintptr_t grad) {
        if (B > 0) {
          require(rows, "rows");
          require(advantages, "advantages");
        }
        if (B > 0 && T > 0) {
          require(logp, "logp");
          require(old_logp, "old_logp");
          require(mask, "mask");
          if (backward) require(grad, "grad");
        }
        if (backward && B > 0) require(grad_loss, "grad_loss");
        if (!backward) {
          require(loss, "loss");
          require(metrics, "metrics");
        }
        prepare(device);
        const auto operand = [](uintptr_t p, int type) {
          return rlk::Operand{ptr<const void>(p), type};
        };
        rlk::PolicyLossArgs a{operand(logp, logp_type), operand(old_logp, old_logp_type),
                              operand(advantages, advantages_type), operand(mask, mask_type),
                              operand(ref_logp, ref_logp_type),
                              operand(rollout_logp, rollout_logp_type),
                              operand(importance_weights, importance_weights_type), B, T,
                              adv_per_token, weights_per_token, settings, ptr<double>(rows),
                              ptr<float>(loss), ptr<float>(metrics), ptr<const float>(grad_loss),
                              ptr<void>(grad), backward ? logp_type : rlk::kElemF32};
        void* s = reinterpret_cast<void*>(stream);
        check(backward ? rlk::policy_loss_backward(a, s) : rlk::policy_loss_forward(a, s));
      },
      nb::kw_only(), "backward"_a, "device"_a, "stream"_a, "logp"_a, "logp_type"_a,
      "old_logp"_a, "old_logp_type"_a, "advantages"_a, "advantages_type"_a, "mask"_a,
      "mask_type"_a, "ref_logp"_a, "ref_logp_type"_a, "rollout_logp"_a, "rollout_logp_type"_a,
      "importance_weights"_a, "importance_weights_type"_a, "B"_a, "T"_a, "adv_per_token"_a,
      "weights_per_token"_a, "settings"_a, "rows"_a, "loss"_a, "metrics"_a, "grad_loss"_a,
      "grad"_a);
}
