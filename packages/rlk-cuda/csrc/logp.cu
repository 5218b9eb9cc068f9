// logp / logp_entropy forward and backward: one pass over the logits each way.
#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

template <typename T, int THREADS, bool ENT>
__global__ void __launch_bounds__(THREADS) logp_fwd_kernel(LogpFwdArgs a) {
  const int64_t i = blockIdx.x;
  const int64_t row = a.rows ? a.rows[i] : i;
  const bool bad_row = row < 0 || row >= a.M;
  const int64_t tok = (a.tokens && !bad_row) ? a.tokens[row] : 0;
  if (a.tokens && tok == a.ignore_index) {  // ignored rows never read their logits
    if (threadIdx.x == 0) {
      if (a.logp) a.logp[i * a.logp_stride] = 0.f;
      if (a.entropy) a.entropy[i] = 0.f;
      if (a.lse) a.lse[i] = 0.f;
      if (a.stats) { a.stats[i] = 0.f; a.stats[a.R + i] = 0.f; }
    }
    return;
  }
  if (bad_row) {
    if (threadIdx.x == 0) {
      const float nan = __int_as_float(0x7fc00000);
      if (a.logp) a.logp[i * a.logp_stride] = nan;
      if (a.entropy) a.entropy[i] = nan;
      if (a.lse) a.lse[i] = nan;
      if (a.stats) { a.stats[i] = nan; a.stats[a.R + i] = nan; }
    }
    return;
  }
  const float temp = a.temp_rows ? a.temp_rows[row] : a.temperature;
  const float inv_t = 1.0f / temp;
  const float sc = inv_t * kLog2e;
  const T* p = static_cast<const T*>(a.logits) + row * a.row_stride;
  const RowAcc r = row_stats<T, THREADS, 4, ENT>(p, a.V, sc);
  if (threadIdx.x != 0) return;
  const float nan = __int_as_float(0x7fc00000);
  const float log_s = logf(r.s);
  const bool empty = r.m == -INFINITY;
  if (a.lse) a.lse[i] = empty ? -INFINITY : fmaf(r.m, inv_t, log_s);
  if (a.stats) { a.stats[i] = r.m; a.stats[a.R + i] = empty ? nan : log_s; }
  if (a.entropy) a.entropy[i] = empty ? nan : log_s - kLn2 * (r.w / r.s);
  if (a.logp) {
    float lp = nan;
    if (!empty && tok >= 0 && tok < a.V) lp = logp_from_stats(to_float(p[tok]), r.m, inv_t, log_s);
    a.logp[i * a.logp_stride] = lp;
  }
}

// Gradient of a row, written in one pass: (g*(onehot - p) - ge*p*(t + H)) / T with
// t = x/T - lse, p = exp(t). Rows with no upstream gradient (or ignored) get zeros without
// reading the logits; an out-of-range token gives NaN.
template <typename T, int THREADS, bool ENT>
__global__ void __launch_bounds__(THREADS) logp_bwd_kernel(LogpBwdArgs a) {
  constexpr int W = VecWidth<T>::value;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t tok = a.tokens[row];
  const float g = a.g_logp[row];
  const float ge = ENT ? a.g_ent[row] : 0.f;
  const T* p = static_cast<const T*>(a.logits) + row * a.row_stride;
  T* o = static_cast<T*>(a.grad) + row * a.grad_row_stride;
  int mode = 2;  // 0 zeros, 1 NaN, 2 compute
  if (tok == a.ignore_index || (g == 0.f && ge == 0.f)) mode = 0;
  else if (tok < 0 || tok >= a.vocab_total) mode = 1;
  const float temp = a.temp_rows ? a.temp_rows[row] : a.temperature;
  const float inv_t = 1.0f / temp;
  const float lse = a.lse[row];
  const float h = ENT ? a.entropy[row] : 0.f;
  const float c1 = -(g + ge * h) * inv_t;  // grad = p * (c1 + c2 * t) + [j == tok] * g / T
  const float c2 = -ge * inv_t;
  const float ctok = g * inv_t;
  const int64_t ltok = tok - a.col_offset;
  const float fill = mode == 1 ? __int_as_float(0x7fc00000) : 0.f;
  auto grad_of = [&](int64_t j, float x) -> float {
    if (mode != 2) return fill;
    const float t = fmaf(x, inv_t, -lse);
    const float pr = exp2f(t * kLog2e);
    float gr = ENT ? pr * fmaf(c2, t, c1) : pr * c1;
    if (j == ltok) gr += ctok;
    return gr;
  };
  const int64_t V = a.V;
  const int64_t h_in = head_elems(p, V);
  const int64_t h_out = head_elems<T>(o, V);
  if (h_in != h_out) {  // input and output disagree on alignment: scalar path
    for (int64_t j = tid; j < V; j += THREADS) {
      const float x = mode == 2 ? to_float(p[j]) : 0.f;
      o[j] = from_float<T>(grad_of(j, x));
    }
    return;
  }
  if (tid < h_in) o[tid] = from_float<T>(grad_of(tid, mode == 2 ? to_float(p[tid]) : 0.f));
  const int64_t nv = (V - h_in) / W;
  const uint4* v4 = reinterpret_cast<const uint4*>(p + h_in);
  uint4* o4 = reinterpret_cast<uint4*>(o + h_in);
  // One 16-byte vector: the token test is one 32-bit compare per element.
  auto vec = [&](const uint4& r, int64_t j) {
    float x[W];
    if (mode == 2) {
      unpack<T>(r, x);
      const int64_t dk = ltok - (h_in + j * W);
      const int kt = (dk >= 0 && dk < W) ? static_cast<int>(dk) : -1;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float t = fmaf(x[k], inv_t, -lse);
        const float pr = exp2f(t * kLog2e);
        x[k] = ENT ? pr * fmaf(c2, t, c1) : pr * c1;
        if (k == kt) x[k] += ctok;
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) x[k] = fill;
    }
    store_stream(o4 + j, pack<T>(x));
  };
  constexpr int U = 4;
  int64_t j = tid;
  for (; j + (U - 1) * THREADS < nv; j += U * THREADS) {
    uint4 r[U];
    if (mode == 2) {
#pragma unroll
      for (int u = 0; u < U; ++u) r[u] = load_stream(v4 + j + u * THREADS);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) vec(r[u], j + u * THREADS);
  }
  for (; j < nv; j += THREADS) {
    uint4 r;
    if (mode == 2) r = load_stream(v4 + j);
    vec(r, j);
  }
  const int64_t t = h_in + nv * W + tid;
  if (t < V) o[t] = from_float<T>(grad_of(t, mode == 2 ? to_float(p[t]) : 0.f));
}

const char* last_error() {
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

template <typename T, int THREADS>
void launch_fwd(const LogpFwdArgs& a, rlkStream_t s) {
  if (a.entropy) logp_fwd_kernel<T, THREADS, true><<<a.R, THREADS, 0, s>>>(a);
  else logp_fwd_kernel<T, THREADS, false><<<a.R, THREADS, 0, s>>>(a);
}

template <typename T>
void launch_fwd_sized(const LogpFwdArgs& a, rlkStream_t s) {
  // The block size depends on V only, never on the number of rows: batch invariance.
  if (a.V >= 16384) launch_fwd<T, 512>(a, s);
  else if (a.V >= 2048) launch_fwd<T, 256>(a, s);
  else launch_fwd<T, 128>(a, s);
}

template <typename T, int THREADS>
void launch_bwd(const LogpBwdArgs& a, rlkStream_t s) {
  if (a.g_ent) logp_bwd_kernel<T, THREADS, true><<<a.M, THREADS, 0, s>>>(a);
  else logp_bwd_kernel<T, THREADS, false><<<a.M, THREADS, 0, s>>>(a);
}

template <typename T>
void launch_bwd_sized(const LogpBwdArgs& a, rlkStream_t s) {
  if (a.V >= 16384) launch_bwd<T, 512>(a, s);
  else if (a.V >= 2048) launch_bwd<T, 256>(a, s);
  else launch_bwd<T, 128>(a, s);
}

}  // namespace

const char* select_device(int device) {
  const rlkError_t e = rlkSetDevice(device);
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

const char* logp_forward(const LogpFwdArgs& a, void* stream) {
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.R == 0) return nullptr;
  if (a.R > 0x7fffffffLL) return "logp_forward: too many rows for one launch";
  switch (a.dtype) {
    case kF32: launch_fwd_sized<float>(a, s); break;
    case kBF16: launch_fwd_sized<bf16_t>(a, s); break;
    case kF16: launch_fwd_sized<f16_t>(a, s); break;
    default: return "logp_forward: unsupported dtype code";
  }
  return last_error();
}

const char* logp_backward(const LogpBwdArgs& a, void* stream) {
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.M == 0 || a.V == 0) return nullptr;
  if (a.M > 0x7fffffffLL) return "logp_backward: too many rows for one launch";
  if (a.g_ent && !a.entropy) return "logp_backward: grad_entropy needs the forward entropy";
  switch (a.dtype) {
    case kF32: launch_bwd_sized<float>(a, s); break;
    case kBF16: launch_bwd_sized<bf16_t>(a, s); break;
    case kF16: launch_bwd_sized<f16_t>(a, s); break;
    default: return "logp_backward: unsupported dtype code";
  }
  return last_error();
}

}  // namespace rlk
