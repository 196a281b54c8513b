#include "logitd/reference/fp64_products.h"

namespace logitd {

std::int64_t WeightMemo::Get(Key key, const std::function<std::int64_t()>& count) {
  {
    absl::MutexLock lock(&mu_);
    const auto it = values_.find(key);
    if (it != values_.end()) return it->second;
  }
  const std::int64_t value = count();
  absl::MutexLock lock(&mu_);
  values_.emplace(key, value);
  return value;
}

void FormXWt(Fp64Products* engine, const std::vector<double>& x, std::int64_t m, Bf16Matrix w,
             double* y, double* y_abs) {
  if (engine != nullptr && engine->XWt(x.data(), m, y, y_abs)) return;
  ReferenceXWt(x, m, w, y, y_abs);
}

void FormGW(Fp64Products* engine, const std::vector<double>& g, std::int64_t m, Bf16Matrix w,
            double* dx, double* dx_abs) {
  if (engine != nullptr && engine->GW(g.data(), m, dx, dx_abs)) return;
  ReferenceGW(g, m, w, dx, dx_abs);
}

}  // namespace logitd
