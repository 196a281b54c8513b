// A weight as a backend holds it (Backend::LoadWeight), what every
// operation's arguments (ops/) name.
#pragma once

#include <cstdint>
#include <memory>

namespace logitd {
class WeightMemo;  // logitd/reference/fp64_products.h
}  // namespace logitd

namespace logitd::kernels {

// A registered weight W [V, K] (bf16) as the backend stores it, plus its
// optional fp32 gradient buffer [V, K]. Created by Backend::LoadWeight; kept
// alive by shared_ptr while any call uses it, so release during a call is safe.
class Weight {
 public:
  Weight(std::int64_t v, std::int64_t k);
  virtual ~Weight() = default;
  Weight(const Weight&) = delete;
  Weight& operator=(const Weight&) = delete;

  std::int64_t v() const { return v_; }
  std::int64_t k() const { return k_; }
  // Bytes held for the weight itself.
  virtual std::uint64_t weight_bytes() const = 0;
  // Bytes held for the gradient buffer (0 until the first accumulate).
  virtual std::uint64_t gradient_bytes() const = 0;
  // What Verify counts of the weight once for all its calls (a reference
  // engine made for it keeps its counts here).
  const std::shared_ptr<WeightMemo>& memo() const { return memo_; }

 private:
  std::int64_t v_;
  std::int64_t k_;
  std::shared_ptr<WeightMemo> memo_;
};

}  // namespace logitd::kernels
