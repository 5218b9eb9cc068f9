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
           uintptr_t entropy, uintptr_t lse, uintptr_t stats, int nseg, uintptr_t partial,
           bool tma) {
          if (R > 0 && V > 0) require(logits, "logits");
          prepare(device);
          rlk::LogpFwdArgs a{ptr<const void>(logits), dtype, M, V, row_stride,
                             ptr<const int64_t>(tokens), ptr<const int64_t>(rows), R, temperature,
                             ptr<const float>(temp_rows), ignore_index, ptr<float>(logp),
                             logp_stride, ptr<float>(entropy), ptr<float>(lse), ptr<float>(stats),
                             nseg, ptr<float>(partial)};
          void* s = reinterpret_cast<void*>(stream);
          check(tma ? rlk::logp_forward_tma(a, s) : rlk::logp_forward(a, s));
        });

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
                             ptr<const float>(g_ent), ptr<const float>(lse),
                             ptr<const float>(entropy), temperature, ptr<const float>(temp_rows),
                             ignore_index, col_offset, vocab_total};
          check(rlk::logp_backward(a, reinterpret_cast<void*>(stream)));
        });

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
                              ptr<float>(entropy), ptr<float>(lse)};
          void* s = reinterpret_cast<void*>(stream);
          check(phase == 0 ? rlk::logp_cols_partial(a, s) : rlk::logp_cols_merge(a, s));
        });

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
        });

  m.attr("GROUP_ADVANTAGES_CHUNK") = rlk::kGroupAdvChunk;
  m.def("group_advantages",
        [](int device, uintptr_t stream, uintptr_t rewards, uintptr_t group_ids, int64_t N,
           int64_t num_groups, bool normalize_std, bool leave_one_out, float eps, uintptr_t out,
           uintptr_t ordered_chunks) {
          if (N > 0) {
            require(rewards, "rewards");
            require(group_ids, "group_ids");
            require(out, "out");
            require(ordered_chunks, "ordered_chunks");
          }
          prepare(device);
          rlk::GroupAdvArgs a{ptr<const float>(rewards), ptr<const int64_t>(group_ids), N,
                              num_groups, normalize_std, leave_one_out, eps, ptr<float>(out),
                              ptr<int>(ordered_chunks)};
          check(rlk::group_advantages(a, reinterpret_cast<void*>(stream)));
        });

  m.def("sample",
        [](int device, uintptr_t stream, uintptr_t logits, int dtype, int64_t B, int64_t V,
           int64_t row_stride, float temperature, int64_t top_k, float top_p, float min_p,
           uintptr_t seeds, uintptr_t stats, uintptr_t tokens, uintptr_t logp,
           uintptr_t processed_logp) {
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
                            top_p, min_p, ptr<const int64_t>(seeds), ptr<const float>(stats),
                            ptr<int64_t>(tokens), ptr<float>(logp), ptr<float>(processed_logp)};
          check(rlk::sample(a, reinterpret_cast<void*>(stream)));
        });

  // policy_loss: backward=false writes loss and metrics, backward=true writes grad.
  m.attr("POLICY_LOSS_ROW_STATS") = rlk::kPolicyLossRowStats;
  m.def("policy_loss",
        [](bool backward, int device, uintptr_t stream, uintptr_t logp, uintptr_t old_logp,
           uintptr_t advantages, uintptr_t mask, uintptr_t ref_logp, uintptr_t rollout_logp,
           int64_t B, int64_t T, bool adv_per_token, float ratio_low, float ratio_high,
           float dual_clip, float kl_coef, int kl_estimator, bool sequence_ratio, int agg,
           float tis_cap, uintptr_t rows, uintptr_t loss, uintptr_t metrics, uintptr_t grad_loss,
           uintptr_t grad) {
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
          rlk::PolicyLossArgs a{ptr<const float>(logp), ptr<const float>(old_logp),
                                ptr<const float>(advantages), ptr<const float>(mask),
                                ptr<const float>(ref_logp), ptr<const float>(rollout_logp), B, T,
                                adv_per_token, ratio_low, ratio_high, dual_clip, kl_coef,
                                kl_estimator, sequence_ratio, agg, tis_cap, ptr<double>(rows),
                                ptr<float>(loss), ptr<float>(metrics), ptr<const float>(grad_loss),
                                ptr<float>(grad)};
          void* s = reinterpret_cast<void*>(stream);
          check(backward ? rlk::policy_loss_backward(a, s) : rlk::policy_loss_forward(a, s));
        });
}
