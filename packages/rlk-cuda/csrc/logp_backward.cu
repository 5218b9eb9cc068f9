// logp / logp_entropy backward: one pass over the logits, writing their gradient (the
// forward: logp.cu).
#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

// Blocks per SM the backward asks registers for (0: the compiler's choice): its choice where
// the logits' rows meet the gradient's on 16-byte boundaries, but 3 blocks of 512 threads
// (40 registers, as before rows at any alignment were read); at any alignment (ANY), which
// would take 64-80 registers, 64 (2 blocks of 512 threads, 4 of 256).
constexpr int bwd_min_blocks(int threads, bool any) {
  if (any) return 1024 / threads;
  return threads >= 512 ? 3 : 0;
}

// Gradient of a row, written in one pass: (g*(onehot - p) - ge*p*(t + H)) / T with
// t = x/T - lse, p = exp(t). Rows with no upstream gradient (or ignored) get zeros without
// reading the logits; an out-of-range token gives NaN. Logits T, gradient O (T or narrower).
//
// Precision where one token dominates and x/T is large: the float64 lse is split once per row
// into a pivot near the row max and a small rest, so t = (x - pivot)/T - rest subtracts the
// large parts exactly; at the token, 1 - p is -expm1(t), not 1 minus a rounded p.
template <typename T, typename O, int THREADS, bool ENT, bool ANY>
__global__ void RLK_LAUNCH_BOUNDS(THREADS, bwd_min_blocks(THREADS, ANY))
    logp_bwd_kernel(LogpBwdArgs a) {
  constexpr int W = VecWidth<T>::value;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t tok = a.tokens[row];
  const float g = a.g_logp[row];
  const float ge = ENT ? a.g_ent[row] : 0.f;
  const T* p = static_cast<const T*>(a.logits) + row * a.row_stride;
  O* o = static_cast<O*>(a.grad) + row * a.grad_row_stride;
  int mode = 2;  // 0 zeros, 1 NaN, 2 compute
  if (tok == a.ignore_index || (g == 0.f && ge == 0.f)) mode = 0;
  else if (tok < 0 || tok >= a.vocab_total) mode = 1;
  const float temp = a.temp_rows ? a.temp_rows[row] : a.temperature;
  const float inv_t = inverse_temperature(temp);
  const double lse = a.lse[row];
  const float pivot = static_cast<float>(lse / inv_t);
  const float rest = static_cast<float>(lse - static_cast<double>(pivot) * inv_t);
  const float h = ENT ? a.entropy[row] : 0.f;
  const float c1 = -(g + ge * h) * inv_t;  // grad = p * (c1 + c2 * t) + [j == tok] * g / T
  const float c2 = -ge * inv_t;
  const float c1_ent = -ge * h * inv_t;  // c1 without the logp part, for the token
  const float ctok = g * inv_t;
  const int64_t ltok = tok - a.col_offset;
  const float fill = mode == 1 ? __int_as_float(0x7fc00000) : 0.f;
  // The gradient at an element with log-probability t, p = exp(t); 0 * inf guarded
  auto grad_at = [&](float t, float pr, bool is_tok) -> float {
    if (!is_tok) return ENT ? (pr == 0.f ? 0.f : pr * fmaf(c2, t, c1)) : pr * c1;
    const float ent = ENT ? (pr == 0.f ? 0.f : pr * fmaf(c2, t, c1_ent)) : 0.f;
    return fmaf(-ctok, expm1f(t), ent);
  };
  auto grad_of = [&](int64_t j, float x) -> float {
    if (mode != 2) return fill;
    const float t = fmaf(x - pivot, inv_t, -rest);
    return grad_at(t, exp2f(t * kLog2e), j == ltok);
  };
  const int64_t V = a.V;
  const int seg = blockIdx.y, nseg = gridDim.y;
  // The gradient's row is peeled to its vector boundary; the logits may then start anywhere
  // (row_vectors.cuh), as in a slice of wider rows beside a fresh, dense gradient.
  constexpr int kOutBytes = static_cast<int>(sizeof(O)) * W;
  const uintptr_t omis = reinterpret_cast<uintptr_t>(o) % kOutBytes;
  if (omis % sizeof(O) != 0) {  // a gradient off its element grid: scalar path, one block
    if (seg != 0) return;
    for (int64_t j = tid; j < V; j += THREADS) {
      const float x = mode == 2 ? to_float(p[j]) : 0.f;
      o[j] = from_float<O>(grad_of(j, x));
    }
    return;
  }
  const int64_t head = min(V, static_cast<int64_t>(omis == 0 ? 0 : (kOutBytes - omis) / sizeof(O)));
  if (seg == 0 && tid < head)
    o[tid] = from_float<O>(grad_of(tid, mode == 2 ? to_float(p[tid]) : 0.f));
  const int64_t nv_all = (V - head) / W;
  // Segment `seg` of the row's vectors: rows split into fixed-size pieces (by V only) so the
  // grid has many short blocks and the last wave is short.
  constexpr int U = 4;
  const int64_t step = static_cast<int64_t>(U) * THREADS;
  const int64_t per = ((nv_all + nseg - 1) / nseg + step - 1) / step * step;
  const int64_t v0 = seg * per;
  const int64_t nv = v0 + per < nv_all ? v0 + per : nv_all;
  const GridPos at = grid_pos(p + head);
  O* ov = o + head;
  // One 16-byte vector: the token test is one 32-bit compare per element.
  auto vec = [&](const uint4& r, int64_t j) {
    float x[W];
    if (mode == 2) {
      unpack<T>(r, x);
      const int64_t dk = ltok - (head + j * W);
      const int kt = (dk >= 0 && dk < W) ? static_cast<int>(dk) : -1;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float t = fmaf(x[k] - pivot, inv_t, -rest);
        x[k] = grad_at(t, exp2f(t * kLog2e), k == kt);
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) x[k] = fill;
    }
    store_grad<O, W>(ov + j * W, x);
  };
  auto rows = [&](auto shift) {
    constexpr int Q = decltype(shift)::value;
    int64_t j = v0 + tid;
    for (; j + (U - 1) * THREADS < nv; j += U * THREADS) {
      uint4 r[U];
      if (mode == 2) load_vectors<U, THREADS, Q, false>(r, at, j, nv);
#pragma unroll
      for (int u = 0; u < U; ++u) vec(r[u], j + u * THREADS);
    }
    if (j < nv) {  // the segment's last vectors (fewer than U), their loads in flight together
      uint4 r[U];
      if (mode == 2) load_vectors<U, THREADS, Q, true>(r, at, j, nv);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j + u * THREADS < nv) vec(r[u], j + u * THREADS);
    }
  };
  if constexpr (ANY) with_shift(at.mis, rows);
  else rows(Shift<kAligned>{});
  const int64_t t = head + nv_all * W + tid;
  if (seg == nseg - 1 && t < V) o[t] = from_float<O>(grad_of(t, mode == 2 ? to_float(p[t]) : 0.f));
}

// Backward launch shapes, by V only (batch invariance). Large rows: one 512-thread block per
// row (measured on the H200 at V=151936 bf16: 4055 GB/s against 3946 GB/s for 256-thread
// blocks over 16384-element segments, either way of writing). Smaller rows: 16384-element
// segments so the grid still has many blocks.
constexpr int64_t kBwdWholeRow = 65536;
constexpr int64_t kBwdSegment = 16384;

template <typename T, typename O, int THREADS, bool ANY>
void launch_bwd(const LogpBwdArgs& a, unsigned nseg, rlkStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.M), nseg);
  if (a.g_ent) logp_bwd_kernel<T, O, THREADS, true, ANY><<<grid, THREADS, 0, s>>>(a);
  else logp_bwd_kernel<T, O, THREADS, false, ANY><<<grid, THREADS, 0, s>>>(a);
}

template <typename T, typename O, bool ANY>
void launch_bwd_shaped(const LogpBwdArgs& a, rlkStream_t s) {
  if (a.V >= kBwdWholeRow) return launch_bwd<T, O, 512, ANY>(a, 1, s);
  const unsigned nseg = static_cast<unsigned>((a.V + kBwdSegment - 1) / kBwdSegment);
  if (a.V >= 2048) launch_bwd<T, O, 256, ANY>(a, nseg, s);
  else launch_bwd<T, O, 128, ANY>(a, nseg, s);
}

// Whether every row's logits, once its gradient row is peeled to a vector boundary, start on
// a 16-byte boundary too: the same element phase modulo W in both, and row strides that keep
// it (then the kernels without the shifts serve).
template <typename T, typename O>
bool phases_agree(const LogpBwdArgs& a) {
  constexpr int64_t W = VecWidth<T>::value;
  const auto in = reinterpret_cast<uintptr_t>(a.logits), out = reinterpret_cast<uintptr_t>(a.grad);
  if (in % sizeof(T) != 0 || out % sizeof(O) != 0) return false;
  const int64_t phase =
      static_cast<int64_t>(in / sizeof(T)) - static_cast<int64_t>(out / sizeof(O));
  return phase % W == 0 && (a.M <= 1 || (a.row_stride - a.grad_row_stride) % W == 0);
}

template <typename T, typename O = T>
void launch_bwd_sized(const LogpBwdArgs& a, rlkStream_t s) {
  if (phases_agree<T, O>(a)) launch_bwd_shaped<T, O, false>(a, s);
  else launch_bwd_shaped<T, O, true>(a, s);
}

}  // namespace

const char* logp_backward(const LogpBwdArgs& a, void* stream) {
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.M == 0 || a.V == 0) return nullptr;
  if (a.M > 0x7fffffffLL) return "logp_backward: too many rows for one launch";
  if (a.g_ent && !a.entropy) return "logp_backward: grad_entropy needs the forward entropy";
  if (a.grad_dtype != a.dtype) {  // float32 logits, gradient in the GEMM input dtype
    if (a.dtype != kF32) return "logp_backward: a gradient dtype of its own needs float32 logits";
    switch (a.grad_dtype) {
      case kBF16: launch_bwd_sized<float, bf16_t>(a, s); break;
      case kF16: launch_bwd_sized<float, f16_t>(a, s); break;
      default: return "logp_backward: unsupported gradient dtype code";
    }
    return last_error();
  }
  switch (a.dtype) {
    case kF32: launch_bwd_sized<float>(a, s); break;
    case kBF16: launch_bwd_sized<bf16_t>(a, s); break;
    case kF16: launch_bwd_sized<f16_t>(a, s); break;
    default: return "logp_backward: unsupported dtype code";
  }
  return last_error();
}

}  // namespace rlk
