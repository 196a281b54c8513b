#include "server/kernels/cpu/row_walk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "logitd/bf16.h"

namespace logitd::kernels::cpu {

std::int64_t CeChunkRows(std::int64_t requested, std::int64_t m, std::int64_t v) {
  std::int64_t c = 0;
  if (requested > 0) {
    c = std::min(requested, v);
    c = (c + kCeTile - 1) / kCeTile * kCeTile;
  } else {
    c = kCeChunkBytes / static_cast<std::int64_t>(sizeof(float)) / m / kCeTile * kCeTile;
    c = std::max(c, kCeTile);
  }
  return std::min(c, v);
}

void CeTileMaxSum(const float* z, std::int64_t n, float* tile_max, float* tile_sum) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    if (std::isnan(z[j])) {
      mx = z[j];
      break;
    }
    if (z[j] > mx) mx = z[j];
  }
  *tile_max = mx;
  *tile_sum = 0.0f;
  if (!std::isfinite(mx)) return;
  float e[kCeTile];
  for (std::int64_t j = 0; j < n; ++j) e[j] = std::exp(z[j] - mx);
  for (std::int64_t j = n; j < kCeTile; ++j) e[j] = 0.0f;
  for (std::int64_t width = kCeTile / 2; width >= 1; width /= 2) {
    for (std::int64_t j = 0; j < width; ++j) e[j] += e[j + width];
  }
  *tile_sum = e[0];
}

void CeSoftcap(float cap, float* y, std::int64_t n) {
  if (cap == 0.0f) return;
  for (std::int64_t j = 0; j < n; ++j) y[j] = cap * std::tanh(y[j] / cap);
}

std::vector<float> CeLosses(const CrossEntropyArgs& args, const std::vector<CeRow>& rows,
                            const std::vector<float>& z_target) {
  std::vector<float> lse(rows.size());
  for (std::int64_t i = 0; i < args.m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    const double l = rows[r].Lse();
    lse[r] = static_cast<float>(l);
    if (args.targets[i] == args.ignore_index) {
      args.loss[i] = 0.0f;
      continue;
    }
    double loss = l - static_cast<double>(z_target[r]);
    // Skipped when off, so that an infinite lse does not give 0 * Inf.
    if (args.z_loss != 0.0f) loss += static_cast<double>(args.z_loss) * l * l;
    args.loss[i] = static_cast<float>(loss);
  }
  if (args.lse != nullptr) std::memcpy(args.lse, lse.data(), lse.size() * sizeof(float));
  return lse;
}

void CeGradChunk(const CrossEntropyArgs& args, const std::vector<float>& lse, std::int64_t v0,
                 std::int64_t c, float* g) {
  const float cap = args.logit_softcap;
  const float z_coef = 2.0f * args.z_loss;
  for (std::int64_t i = 0; i < args.m; ++i) {
    float* row = g + i * c;
    const std::int64_t t = args.targets[i];
    if (t == args.ignore_index) {
      std::fill(row, row + c, 0.0f);
      continue;
    }
    const float l = lse[static_cast<std::size_t>(i)];
    const float coef = args.z_loss != 0.0f ? 1.0f + z_coef * l : 1.0f;
    for (std::int64_t j = 0; j < c; ++j) {
      float z = row[j];
      float dz_dy = 1.0f;
      if (cap != 0.0f) {
        const float th = std::tanh(z / cap);
        z = cap * th;
        dz_dy = (1.0f - th) * (1.0f + th);
      }
      float d = std::exp(z - l) * coef;
      if (v0 + j == t) d -= 1.0f;
      if (cap != 0.0f) d *= dz_dy;
      d *= args.grad_scale;
      row[j] = RoundToBf16(d);
    }
  }
}

bool LpBefore(float za, std::int64_t a, float zb, std::int64_t b) {
  const bool na = std::isnan(za);
  const bool nb = std::isnan(zb);
  if (na != nb) return na;
  if (!na && za != zb) return za > zb;
  return a < b;
}

double LpTileZSum(const float* z, std::int64_t n, float tile_max) {
  if (!std::isfinite(tile_max)) return 0.0;
  double sum = 0.0;
  for (std::int64_t j = 0; j < n; ++j) {
    const double d = static_cast<double>(z[j]) - tile_max;
    const double e = std::exp(d);
    if (e != 0.0) sum += e * d;
  }
  return sum;
}

}  // namespace logitd::kernels::cpu
