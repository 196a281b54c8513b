// Target ids as the tensor a CrossEntropy call carries, for the unit tests
// and the request fuzzer's seeds. Header-only: the fuzzer's replay binary
// links no test library.
#pragma once

#include <cstdint>
#include <vector>

#include "logitd/tensor.h"

namespace logitd::testing {

// `ids` as an INT32 or INT64 [n] tensor; INT32 narrows each id.
inline Tensor TargetsTensor(DType dtype, const std::vector<std::int64_t>& ids) {
  Tensor t(dtype, {static_cast<std::int64_t>(ids.size())});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (dtype == DType::kInt32) {
      t.data<std::int32_t>()[i] = static_cast<std::int32_t>(ids[i]);
    } else {
      t.data<std::int64_t>()[i] = ids[i];
    }
  }
  return t;
}

}  // namespace logitd::testing
