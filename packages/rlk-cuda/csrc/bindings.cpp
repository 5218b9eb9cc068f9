// Python module rlk_cuda._C: argument structs filled by field name, exceptions out.
// Each kernel takes (device, stream, args), args being its rlk_api.h struct bound as a class
// whose constructor takes every field by name (pointers as integer addresses). The Python
// wrappers (rlk_cuda.logp, rlk_cuda.sample, ...) check dtypes, shapes and devices and pass the
// caller's current stream; this layer only guards against null pointers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "rlk_api.h"

// rlk-rocm compiles this file too, under its own name.
#ifndef RLK_EXT_NAME
#define RLK_EXT_NAME "rlk_cuda"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

void prepare(int device) {
  const char* e = rlk::select_device(device);
  if (e != nullptr)
    throw std::runtime_error(std::string(RLK_EXT_NAME ": cannot select device ") +
                             std::to_string(device) + ": " + e);
}

void check(const char* err) {
  if (err != nullptr) throw std::runtime_error(std::string(RLK_EXT_NAME ": kernel launch failed: ") + err);
}

void require(const void* p, const char* what) {
  if (p == nullptr) throw std::invalid_argument(std::string(RLK_EXT_NAME ": null pointer for ") + what);
}

// fields(S*, f) calls f(name, &S::name) for every field of S, from its list in rlk_api.h.
#define RLK_MEMBER(type, name) f(#name, &Struct::name);
#define RLK_FIELDS(S, LIST)                           \
  template <typename F> void fields(rlk::S*, F&& f) { \
    using Struct = rlk::S;                            \
    LIST(RLK_MEMBER)                                  \
  }
RLK_FIELDS(LogpFwdArgs, RLK_LOGP_FWD_ARGS)
RLK_FIELDS(LogpColsArgs, RLK_LOGP_COLS_ARGS)
RLK_FIELDS(SoftCapArgs, RLK_SOFT_CAP_ARGS)
RLK_FIELDS(RelProbArgs, RLK_REL_PROB_ARGS)
RLK_FIELDS(GroupAdvArgs, RLK_GROUP_ADV_ARGS)
RLK_FIELDS(LogpBwdArgs, RLK_LOGP_BWD_ARGS)
RLK_FIELDS(SampleArgs, RLK_SAMPLE_ARGS)
RLK_FIELDS(Operand, RLK_OPERAND)
RLK_FIELDS(PolicyLossSettings, RLK_POLICY_LOSS_SETTINGS)
RLK_FIELDS(PolicyLossArgs, RLK_POLICY_LOSS_ARGS)
RLK_FIELDS(ScaleArgs, RLK_SCALE_ARGS)
RLK_FIELDS(ScaleRowsArgs, RLK_SCALE_ROWS_ARGS)
#undef RLK_FIELDS
#undef RLK_MEMBER

// Python sees a pointer field as its integer address (0 = nullptr), any other as itself;
// TypeError naming the field for a value that does not convert.
template <typename T> T from_python(const char* cls, const char* name, nb::handle value) {
  try {
    if constexpr (std::is_pointer_v<T>)
      return reinterpret_cast<T>(nb::cast<uintptr_t>(value));
    else
      return nb::cast<T>(value);
  } catch (const nb::cast_error&) {
    throw nb::type_error((std::string(cls) + "." + name + ": cannot take " +
                          nb::repr(value).c_str()).c_str());
  }
}

template <typename T> nb::object to_python(const T& value) {
  if constexpr (std::is_pointer_v<T>)
    return nb::cast(reinterpret_cast<uintptr_t>(value));
  else
    return nb::cast(value, nb::rv_policy::copy);
}

// The type of field `member` of S.
template <typename S, typename M>
using field_t = std::remove_reference_t<decltype(std::declval<S&>().*std::declval<M>())>;

// S's field names as interned Python strings, made once: a lookup by a C string would build
// and hash a new one per field and call. Kept for the life of the process.
template <typename S> const std::vector<PyObject*>& keys() {
  static const std::vector<PyObject*> interned = [] {
    std::vector<PyObject*> v;
    fields(static_cast<S*>(nullptr),
           [&](const char* name, auto) { v.push_back(PyUnicode_InternFromString(name)); });
    return v;
  }();
  return interned;
}

// The struct from keyword arguments naming each of its fields once: TypeError for a missing,
// unknown or mistyped one, so that a misspelt name never leaves a field zero.
template <typename S> S from_kwargs(const char* cls, const nb::kwargs& kw) {
  S s{};
  size_t n = 0;
  fields(static_cast<S*>(nullptr), [&](const char* name, auto member) {
    PyObject* value = PyDict_GetItem(kw.ptr(), keys<S>()[n]);  // borrowed
    if (value == nullptr)
      throw nb::type_error((std::string(cls) + ": missing field " + name).c_str());
    s.*member = from_python<field_t<S, decltype(member)>>(cls, name, value);
    ++n;
  });
  if (PyDict_Size(kw.ptr()) != static_cast<Py_ssize_t>(n)) {
    for (auto [key, value] : kw) {
      bool known = false;
      const std::string given = nb::str(key).c_str();
      fields(static_cast<S*>(nullptr),
             [&](const char* name, auto) { known = known || given == name; });
      if (!known) throw nb::type_error((std::string(cls) + ": unknown field " + given).c_str());
    }
  }
  return s;
}

// An argument struct as a Python class: built by field name, each field readable and writable.
template <typename S> void bind_args(nb::module_& m, const char* cls) {
  nb::class_<S> c(m, cls);
  c.def("__init__",
        [cls](S* self, const nb::kwargs& kw) { new (self) S(from_kwargs<S>(cls, kw)); });
  fields(static_cast<S*>(nullptr), [&](const char* name, auto member) {
    using T = field_t<S, decltype(member)>;
    c.def_prop_rw(name, [member](const S& s) { return to_python<T>(s.*member); },
                  [cls, name, member](S& s, nb::handle value) {
                    s.*member = from_python<T>(cls, name, value);
                  });
  });
}

// A kernel entry point taking (device, stream, args) by name: the null-pointer guard, the
// device, then the launch on `stream` (a cudaStream_t or hipStream_t address).
template <typename S>
void def_kernel(nb::module_& m, const char* name, const char* (*launch)(const S&, void*),
                void (*guard)(const S&)) {
  m.def(name,
        [launch, guard](int device, uintptr_t stream, const S& args) {
          guard(args);
          prepare(device);
          check(launch(args, reinterpret_cast<void*>(stream)));
        },
        nb::kw_only(), "device"_a, "stream"_a, "args"_a);
}

void logp_forward_guard(const rlk::LogpFwdArgs& a) {
  if (a.R > 0 && a.V > 0) require(a.logits, "logits");
}

void logp_backward_guard(const rlk::LogpBwdArgs& a) {
  if (a.M > 0 && a.V > 0) {
    require(a.logits, "logits");
    require(a.grad, "grad");
    require(a.tokens, "tokens");
    require(a.g_logp, "grad_logp");
    require(a.lse, "lse");
  }
}

void logp_cols_guard(const rlk::LogpColsArgs& a) {
  if (a.N > 0) {
    require(a.tokens, "tokens");
    require(a.partial, "partial");
    require(a.tok_logit, "tok_logit");
  }
}

void relative_probs_guard(const rlk::RelProbArgs& a) {
  if (a.N > 0) {
    require(a.logits, "logits");
    require(a.out, "out");
    require(a.tokens, "tokens");
    require(a.partial, "partial");
    require(a.logp, "logp");
    require(a.entropy, "entropy");
    require(a.lse, "lse");
    require(a.scale, "scale");
  }
}

void group_advantages_guard(const rlk::GroupAdvArgs& a) {
  if (a.N > 0) {
    require(a.rewards, "rewards");
    require(a.out, "out");
    if (a.group_ids != nullptr) {
      require(a.order, "order");
    } else if (a.group_size <= 0) {
      throw std::invalid_argument(RLK_EXT_NAME ": group_advantages needs group_ids or "
                                  "group_size > 0");
    }
    if (a.normalize == rlk::kNormalizeBatchStd) require(a.batch_std, "batch_std");
  }
}

void policy_loss_guard(const rlk::PolicyLossArgs& a) {
  if (a.B > 0) {
    require(a.rows, "rows");
    require(a.advantages.data, "advantages");
  }
  if (a.B > 0 && a.T > 0) {
    require(a.logp.data, "logp");
    require(a.old_logp.data, "old_logp");
    require(a.mask.data, "mask");
  }
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = RLK_EXT_NAME " kernels (argument structs by field name; use the Python wrappers)";
  m.attr("ARCHITECTURES") = RLK_CUDA_ARCHS;

  m.attr("TMA_BUILT") = rlk::logp_tma_built();

  // Element type codes, named as torch's dtypes.
  nb::enum_<rlk::DType>(m, "DType", nb::is_arithmetic())
      .value("float32", rlk::kF32)
      .value("bfloat16", rlk::kBF16)
      .value("float16", rlk::kF16)
      .value("float64", rlk::kF64)
      .value("uint8", rlk::kU8)
      .value("int8", rlk::kI8)
      .value("int16", rlk::kI16)
      .value("int32", rlk::kI32)
      .value("int64", rlk::kI64);

  // Operand and PolicyLossSettings first: PolicyLossArgs holds them.
  bind_args<rlk::Operand>(m, "Operand");
  bind_args<rlk::PolicyLossSettings>(m, "PolicyLossSettings");
  bind_args<rlk::LogpFwdArgs>(m, "LogpFwdArgs");
  bind_args<rlk::LogpBwdArgs>(m, "LogpBwdArgs");
  bind_args<rlk::LogpColsArgs>(m, "LogpColsArgs");
  bind_args<rlk::SoftCapArgs>(m, "SoftCapArgs");
  bind_args<rlk::RelProbArgs>(m, "RelProbArgs");
  bind_args<rlk::GroupAdvArgs>(m, "GroupAdvArgs");
  bind_args<rlk::SampleArgs>(m, "SampleArgs");
  bind_args<rlk::PolicyLossArgs>(m, "PolicyLossArgs");
  bind_args<rlk::ScaleArgs>(m, "ScaleArgs");
  bind_args<rlk::ScaleRowsArgs>(m, "ScaleRowsArgs");

  // logp_forward_tma takes the Hopper bulk-copy path (logp_tma.cu); nseg must be its segments.
  def_kernel(m, "logp_forward", &rlk::logp_forward, &logp_forward_guard);
  def_kernel(m, "logp_forward_tma", &rlk::logp_forward_tma, &logp_forward_guard);
  m.def("logp_forward_segments", &rlk::logp_forward_segments,
        "Row segments the forward uses for vocabulary size V (scratch: R * segments * 3 floats)");
  m.def("logp_forward_tma_segments", &rlk::logp_forward_tma_segments,
        "Row segments of the bulk-copy forward for vocabulary size V (always needs scratch)");
  def_kernel(m, "logp_backward", &rlk::logp_backward, &logp_backward_guard);

  // linear_logp forward over vocabulary chunks: one chunk's partials, then the merge.
  def_kernel(m, "logp_cols_partial", &rlk::logp_cols_partial,
             +[](const rlk::LogpColsArgs& a) {
               logp_cols_guard(a);
               if (a.N > 0) require(a.logits, "logits");
             });
  def_kernel(m, "logp_cols_merge", &rlk::logp_cols_merge, +[](const rlk::LogpColsArgs& a) {
    logp_cols_guard(a);
    if (a.N > 0) {
      require(a.logp, "logp");
      require(a.lse, "lse");
    }
  });

  // linear_policy_loss: a float32 logits chunk's statistics and relative probabilities.
  m.def("relative_probs_segments", &rlk::relative_probs_segments, nb::kw_only(), "V"_a);
  def_kernel(m, "relative_probs", &rlk::relative_probs, &relative_probs_guard);

  // A contiguous tensor times a float32 device scalar, in place (nothing to do when it is 1).
  def_kernel(m, "scale_by_device_factor", &rlk::scale_by_device_factor,
             +[](const rlk::ScaleArgs& a) {
               if (a.n > 0) {
                 require(a.data, "data");
                 require(a.factor, "factor");
               }
             });

  // out[r, :] = src[r, :] * factor[r] in out's dtype, zeros where factor[r] is 0.
  def_kernel(m, "scale_rows", &rlk::scale_rows, +[](const rlk::ScaleRowsArgs& a) {
    if (a.rows > 0 && a.cols > 0) {
      require(a.src, "src");
      require(a.out, "out");
      require(a.factor, "factor");
    }
  });

  // Soft cap of a float32 logits chunk in place (grad null), or its chain rule into grad.
  def_kernel(m, "soft_cap", &rlk::soft_cap, +[](const rlk::SoftCapArgs& a) {
    if (a.N > 0 && a.C > 0) require(a.logits, "logits");
  });

  def_kernel(m, "group_advantages", &rlk::group_advantages, &group_advantages_guard);

  // The statistics pass (the logp forward's, with or without tma) and the draw, in one call:
  // stats [2, B] and partial are scratch.
  def_kernel(m, "sample", &rlk::sample, +[](const rlk::SampleArgs& a) {
    if (a.B > 0) {
      require(a.logits, "logits");
      require(a.seeds, "seeds");
      require(a.stats, "stats");
      require(a.tokens, "tokens");
      require(a.logp, "logp");
      require(a.processed_logp, "processed_logp");
    }
  });

  // policy_loss: the options as a settings struct (built once per options object), the
  // tensors as Operands. The forward writes loss and metrics, and grad when given (float32,
  // at upstream 1 unless grad_loss is given); the backward writes grad in grad_type.
  m.attr("POLICY_LOSS_ROW_STATS") = rlk::kPolicyLossRowStats;
  def_kernel(m, "policy_loss_forward", &rlk::policy_loss_forward,
             +[](const rlk::PolicyLossArgs& a) {
               policy_loss_guard(a);
               require(a.loss, "loss");
               require(a.metrics, "metrics");
             });
  def_kernel(m, "policy_loss_backward", &rlk::policy_loss_backward,
             +[](const rlk::PolicyLossArgs& a) {
               policy_loss_guard(a);
               if (a.B > 0 && a.T > 0) require(a.grad, "grad");
               if (a.B > 0) require(a.grad_loss, "grad_loss");
             });
}
