// group_advantages: a team of threads per group (32 lanes when groups are small, one block when
// they are large) computes the group's float64 statistics in a fixed order: deterministic.
//
// Consecutive groups of a fixed size (group_size=) are read as runs [g * size, (g + 1) * size)
// in one launch. Group ids come sorted (the host wrapper sorts them stably, so each group's
// members keep their order) with the permutation `order`: group g's members are the run
// [first id >= g, first id > g), found in O(1) for equal groups and by binary search
// otherwise, and member i of the run is reward order[i]. Every team reads only its own run:
// the work is O(N) whatever order the ids came in. Batch std scaling first reduces the whole
// batch in one block.
#include <cmath>

#include "common.cuh"
#include "rlk_api.h"

namespace rlk {
namespace {

constexpr int kThreads = 256;
// Lanes per group when groups are small: a warp, or half a wave64 (the host cannot know which
// wave size the device code has, so the launch shape must not depend on it).
constexpr int kLanes = 32;
constexpr int64_t kLanesGroupMax = 4 * kLanes;  // largest mean group size served by 32 lanes
constexpr int kBatchThreads = 1024;

// TEAM threads serve one group: kLanes (several groups per block) or the block.
template <int TEAM>
struct Team {
  static_assert(TEAM == kLanes || TEAM == kThreads, "a team is 32 lanes or the block");
  double* scratch;

  __device__ int lane() const { return threadIdx.x % TEAM; }
  __device__ int64_t group() const {
    return static_cast<int64_t>(blockIdx.x) * (kThreads / TEAM) + threadIdx.x / TEAM;
  }
  template <typename T, typename Op>
  __device__ T reduce(T v, T* block_scratch, Op op) const {
    if constexpr (TEAM == kThreads) return block_reduce<kThreads>(v, block_scratch, op);
    else return warp_reduce<kLanes>(v, op);
  }
  __device__ double sum(double v) const { return reduce(v, scratch, SumOp{}); }
  __device__ double min(double v) const { return reduce(v, scratch, MinOp{}); }
};

// The first index of non-decreasing `ids` that holds >= g. `guess` (exact when all groups have
// the same size) is tried before a binary search.
__device__ int64_t first_at_least(const int64_t* ids, int64_t n, int64_t g, int64_t guess) {
  if (guess >= 0 && guess <= n && (guess == n || ids[guess] >= g) &&
      (guess == 0 || ids[guess - 1] < g))
    return guess;
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < g) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The batch's sample std of its (valid) rewards: one block, two passes. With fewer than two
// it is 0, or NaN when the one reward is NaN (which then poisons the batch, as with more).
__global__ void __launch_bounds__(kBatchThreads) batch_std_kernel(GroupAdvArgs a) {
  __shared__ double scratch[kBatchThreads / RLK_WARP_SIZE * 2];
  double v[2] = {0.0, 0.0};  // count, sum
  for (int64_t i = threadIdx.x; i < a.N; i += kBatchThreads) {
    const double r = a.rewards[i];
    if (a.nan_ignore && r != r) continue;
    v[0] += 1.0;
    v[1] += r;
  }
  block_sum_array<kBatchThreads>(v, scratch);
  const double count = v[0], mean = v[1] / fmax(count, 1.0);
  double sq = 0.0;
  for (int64_t i = threadIdx.x; i < a.N; i += kBatchThreads) {
    const double r = a.rewards[i];
    if (a.nan_ignore && r != r) continue;
    sq += (r - mean) * (r - mean);
  }
  sq = block_sum<kBatchThreads>(sq, scratch);
  if (threadIdx.x == 0) *a.batch_std = count > 1.0 ? sqrt(sq / (count - 1.0)) : v[1] * 0.0;
}

template <int TEAM>
__global__ void __launch_bounds__(kThreads) group_advantages_kernel(GroupAdvArgs a) {
  __shared__ double scratch[kThreads / RLK_WARP_SIZE];
  const Team<TEAM> team{scratch};
  const int64_t g = team.group();
  if (g >= a.num_groups) return;  // whole teams of the last block (TEAM is kLanes)
  const int lane = team.lane();

  // The members: the group's run, of the sorted ids or consecutive by group_size.
  int64_t begin, end;
  if (a.group_ids == nullptr) {
    begin = g * a.group_size;
    end = begin + a.group_size;
  } else {
    const int64_t size = a.N % a.num_groups == 0 ? a.N / a.num_groups : -1;
    begin = first_at_least(a.group_ids, a.N, g, size < 0 ? -1 : g * size);
    end = first_at_least(a.group_ids, a.N, g + 1, size < 0 ? -1 : (g + 1) * size);
  }
  // run position -> reward index
  const auto at = [&](int64_t i) { return a.order == nullptr ? i : a.order[i]; };
  // whether a member's reward enters the statistics (a NaN does not under nan="ignore")
  const auto counted = [&](float r) { return !(a.nan_ignore && r != r); };

  // Pass 1: member count, NaN members, minimum.
  double count = 0.0, nans = 0.0, low = INFINITY;
  for (int64_t i = begin + lane; i < end; i += TEAM) {
    const float r = a.rewards[at(i)];
    if (!counted(r)) continue;
    count += 1.0;
    nans += r != r ? 1.0 : 0.0;
    low = fmin(low, static_cast<double>(r));
  }
  count = team.sum(count);
  nans = team.sum(nans);
  low = team.min(low);
  // a NaN reward makes its group NaN, and under batch-std (whose std it makes NaN) the batch
  const bool nan = nans > 0.0 || (a.normalize == kNormalizeBatchStd && !a.nan_ignore &&
                                  isnan(*a.batch_std));
  // Pass 2: sum of rewards centred on the minimum (a constant group sums to exactly 0).
  double sum = 0.0;
  for (int64_t i = begin + lane; i < end; i += TEAM) {
    const float r = a.rewards[at(i)];
    if (counted(r)) sum += static_cast<double>(r) - low;
  }
  sum = team.sum(sum);
  const double mean = sum / fmax(count, 1.0);
  // Pass 3: the group's sample standard deviation.
  double std = a.normalize == kNormalizeBatchStd ? *a.batch_std : 0.0;
  if (a.normalize == kNormalizeStd) {
    double sq = 0.0;
    for (int64_t i = begin + lane; i < end; i += TEAM) {
      const float r = a.rewards[at(i)];
      if (!counted(r)) continue;
      const double d = static_cast<double>(r) - low - mean;
      sq += d * d;
    }
    sq = team.sum(sq);
    std = sqrt(sq / fmax(count - 1.0, 1.0));
  }
  const bool single = count == 1.0;
  if (single && a.singleton_reward && a.normalize == kNormalizeStd) std = 1.0;
  // Pass 4: write the group's advantages.
  for (int64_t i = begin + lane; i < end; i += TEAM) {
    const int64_t k = at(i);
    const double r = a.rewards[k];
    if (!counted(static_cast<float>(r))) {  // a NaN reward under nan="ignore"
      a.out[k] = 0.0f;
      continue;
    }
    const double c = r - low;
    double adv = a.leave_one_out ? c - (sum - c) / fmax(count - 1.0, 1.0) : c - mean;
    if (single) adv = a.singleton_reward ? r : 0.0;  // verl: baseline 0 (and std 1)
    // a singleton's reward is not on the batch's scale: batch-std leaves it as it is
    const bool unscaled = single && a.normalize == kNormalizeBatchStd;
    if (a.normalize != kNormalizeNone && adv != 0.0 && !unscaled) adv /= std + a.eps;
    a.out[k] = nan ? __int_as_float(0x7fc00000) : static_cast<float>(adv);
  }
}

}  // namespace

const char* group_advantages(const GroupAdvArgs& a, void* stream) {
  if (a.N == 0 || a.num_groups == 0) return nullptr;
  constexpr int64_t kTeamsPerBlock = kThreads / kLanes;
  const bool small = a.N / a.num_groups <= kLanesGroupMax;
  const int64_t blocks = small ? (a.num_groups + kTeamsPerBlock - 1) / kTeamsPerBlock
                               : a.num_groups;
  if (blocks > 0x7fffffffLL) return "group_advantages: too many groups";
  const rlkStream_t s = static_cast<rlkStream_t>(stream);
  if (a.normalize == kNormalizeBatchStd) {
    batch_std_kernel<<<1, kBatchThreads, 0, s>>>(a);
    if (const char* err = last_error()) return err;
  }
  if (small)
    group_advantages_kernel<kLanes><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(a);
  else
    group_advantages_kernel<kThreads><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(a);
  return last_error();
}

}  // namespace rlk
