// What the logp forward kernels share beyond the row statistics: which row a slot reads, its
// token and temperature, and the merge step that turns per-segment partials into outputs.
#pragma once

#include "logp_row.cuh"
#include "rlk_api.h"

namespace rlk {

struct RowInfo {
  int64_t row, tok;
  float inv_t;
};

__device__ __forceinline__ RowInfo row_info(const LogpFwdArgs& a, int64_t i) {
  const int64_t row = a.rows ? a.rows[i] : i;
  const bool ok = row >= 0 && row < a.M;
  const int64_t tok = (a.tokens && ok) ? a.tokens[row] : 0;
  const float temp = (a.temp_rows && ok) ? a.temp_rows[row] : a.temperature;
  return RowInfo{row, tok, inverse_temperature(temp)};
}

// Rows whose logits are never read: ignored tokens and rows outside [0, M).
__device__ __forceinline__ bool skip_row(const LogpFwdArgs& a, const RowInfo& ri) {
  return (a.tokens && ri.tok == a.ignore_index) || ri.row < 0 || ri.row >= a.M;
}

// Combines a.partial ([R, a.nseg, 3], segments in order) into every output of the forward.
const char* logp_forward_merge(const LogpFwdArgs& a, rlkStream_t stream);

}  // namespace rlk
