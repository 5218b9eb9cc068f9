// group_advantages: one block per group scans the (small, L2-resident) rewards in index order,
// so every sum has a fixed order: deterministic, and exact to float64 accumulation.
#include <cmath>

#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) group_advantages_kernel(GroupAdvArgs a) {
  __shared__ double scratch[kThreads / RLK_WARP_SIZE];
  const int64_t g = blockIdx.x;
  // Pass 1: member count, NaN members, minimum.
  double count = 0.0, nans = 0.0, low = INFINITY;
  for (int64_t i = threadIdx.x; i < a.N; i += kThreads) {
    if (a.group_ids[i] != g) continue;
    const double r = a.rewards[i];
    count += 1.0;
    nans += r != r ? 1.0 : 0.0;
    low = fmin(low, r);
  }
  count = block_reduce<kThreads>(count, scratch, SumOp{});
  nans = block_reduce<kThreads>(nans, scratch, SumOp{});
  low = block_reduce<kThreads>(low, scratch, MinOp{});
  const bool nan = nans > 0.0;
  if (count == 0.0) return;
  // Pass 2: sum of rewards centred on the minimum (a constant group sums to exactly 0).
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < a.N; i += kThreads)
    if (a.group_ids[i] == g) sum += static_cast<double>(a.rewards[i]) - low;
  sum = block_reduce<kThreads>(sum, scratch, SumOp{});
  const double mean = sum / count;
  // Pass 3: sample standard deviation.
  double std = 0.0;
  if (a.normalize_std) {
    double sq = 0.0;
    for (int64_t i = threadIdx.x; i < a.N; i += kThreads) {
      if (a.group_ids[i] != g) continue;
      const double d = static_cast<double>(a.rewards[i]) - low - mean;
      sq += d * d;
    }
    sq = block_reduce<kThreads>(sq, scratch, SumOp{});
    std = sqrt(sq / fmax(count - 1.0, 1.0));
  }
  // Pass 4: write the group's advantages.
  for (int64_t i = threadIdx.x; i < a.N; i += kThreads) {
    if (a.group_ids[i] != g) continue;
    const double c = static_cast<double>(a.rewards[i]) - low;
    double adv = a.leave_one_out ? c - (sum - c) / fmax(count - 1.0, 1.0) : c - mean;
    if (a.normalize_std && adv != 0.0) adv /= std + a.eps;
    a.out[i] = nan ? __int_as_float(0x7fc00000) : static_cast<float>(adv);
  }
}

}  // namespace

const char* group_advantages(const GroupAdvArgs& a, void* stream) {
  if (a.N == 0 || a.num_groups == 0) return nullptr;
  if (a.num_groups > 0x7fffffffLL) return "group_advantages: too many groups";
  group_advantages_kernel<<<static_cast<unsigned>(a.num_groups), kThreads, 0,
                            static_cast<rlkStream_t>(stream)>>>(a);
  const rlkError_t e = rlkGetLastError();
  return e == rlkSuccess ? nullptr : rlkGetErrorString(e);
}

}  // namespace rlk
