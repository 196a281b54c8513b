#include "logitd/reference/verify_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "logit_rows.h"
#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/bounds.h"
#include "logitd/reference/element_judgement.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"
#include "logitd/tensor.h"

namespace logitd {
namespace {

double Bf16At(const Bf16Bits* data, std::int64_t i) { return Bf16ToFloat(data[i]); }

// Element i of dY, rounded once to bf16 (the backward contract's G).
double GAt(const LmHeadInputs& in, std::int64_t i) {
  float f;
  if (in.dy_dtype == DType::kBf16) {
    f = Bf16ToFloat(static_cast<const Bf16Bits*>(in.dy)[i]);
  } else {
    std::memcpy(&f, static_cast<const std::byte*>(in.dy) + i * 4, 4);
  }
  return RoundToBf16(f);
}

std::size_t ElementBytes(DType dtype) { return dtype == DType::kBf16 ? 2 : 4; }

const void* At(const void* data, std::int64_t i, DType dtype) {
  return static_cast<const std::byte*>(data) + i * static_cast<std::int64_t>(ElementBytes(dtype));
}

// Whether any of `n` values from `at(j)` is NaN or infinite.
template <typename At>
bool AnyNonFinite(std::int64_t n, At at) {
  for (std::int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(at(j))) return true;
  }
  return false;
}

// Σ a(t)·b(t) over t < n as IEEE 754 gives it for operands that are NaN or
// infinite, with what ProductBounds needs (element_judgement.h): a finite
// sum comes with Σ|a·b|; +Inf (only +Inf among the products, besides
// finite ones) with the magnitude of the negative finite products, which
// may overflow to −Inf first in some order and make a NaN; −Inf the same
// way round; NaN (a NaN or 0·Inf product, or infinities of both signs)
// with 0.
template <typename A, typename B>
void NaiveDot(std::int64_t n, A a, B b, double* sum, double* abs) {
  double plus = 0, minus = 0;
  bool nan = false, pos_inf = false, neg_inf = false;
  for (std::int64_t t = 0; t < n; ++t) {
    const double p = a(t) * b(t);
    if (std::isnan(p)) {
      nan = true;
    } else if (std::isinf(p)) {
      (p > 0 ? pos_inf : neg_inf) = true;
    } else {
      (p > 0 ? plus : minus) += std::fabs(p);
    }
  }
  if (nan || (pos_inf && neg_inf)) {
    *sum = std::numeric_limits<double>::quiet_NaN();
    *abs = 0;
  } else if (pos_inf || neg_inf) {
    *sum = pos_inf ? std::numeric_limits<double>::infinity()
                   : -std::numeric_limits<double>::infinity();
    *abs = pos_inf ? minus : plus;
  } else {
    *sum = plus - minus;
    *abs = plus + minus;
  }
}

// The class of a vector of bf16 values: the values up to a common power of
// two, hashed in one pass. Each nonzero value contributes its sign and
// significand and its exponent's step from the previous nonzero value's
// (the first one's exponent is left out), which a common scaling keeps;
// zeros contribute their place. Outputs whose operands share their classes
// err alike, relative to their scale, in every order.
class ScaledClass {
 public:
  void Add(Bf16Bits b) {
    std::uint64_t token;
    if ((b & 0x7fff) == 0) {
      token = 1;
    } else {
      const int e = (b >> 7) & 0xff;
      token = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(seen_ ? e - last_ + 512 : 0))
               << 16) |
              (b & 0x807f) | (std::uint64_t{1} << 40);
      last_ = e;
      seen_ = true;
    }
    std::uint64_t z = (hash_ ^ token) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    hash_ = z ^ (z >> 31);
  }
  std::uint64_t value() const { return hash_; }

 private:
  int last_ = 0;
  bool seen_ = false;
  std::uint64_t hash_ = 0;
};

// The number of distinct classes among the rows (by_rows) or the columns
// of a [rows, cols] matrix whose element (i, j) is at(i, j): rows hashed
// on threads, columns walked in row order (a part of the columns a
// thread).
template <typename At>
std::int64_t DistinctClasses(std::int64_t rows, std::int64_t cols, bool by_rows, const At& at) {
  const std::int64_t count = by_rows ? rows : cols;
  std::vector<ScaledClass> classes(static_cast<std::size_t>(count));
  reference_internal::ForRowsInParallel(count, rows * cols,
                                        [&](std::int64_t first, std::int64_t last, int /*part*/) {
                                          if (by_rows) {
                                            for (std::int64_t i = first; i < last; ++i) {
                                              for (std::int64_t j = 0; j < cols; ++j)
                                                classes[static_cast<std::size_t>(i)].Add(at(i, j));
                                            }
                                            return;
                                          }
                                          for (std::int64_t i = 0; i < rows; ++i) {
                                            for (std::int64_t j = first; j < last; ++j)
                                              classes[static_cast<std::size_t>(j)].Add(at(i, j));
                                          }
                                        });
  std::vector<std::uint64_t> hashes;
  hashes.reserve(classes.size());
  for (const ScaledClass& c : classes) hashes.push_back(c.value());
  std::sort(hashes.begin(), hashes.end());
  return static_cast<std::int64_t>(std::unique(hashes.begin(), hashes.end()) - hashes.begin());
}

Bf16Bits GBitsAt(const LmHeadInputs& in, std::int64_t i) {
  return FloatToBf16(static_cast<float>(GAt(in, i)));
}

// The sequential and tensor-core models (accumulation_models.h) of rows
// [first, last) of a block whose row i reduces a_row(i) (n floats) against
// `panel`'s columns: seq and tc, [last − first, cols] each, on the caller's
// thread.
template <typename ARow>
void ModelRows(std::int64_t first, std::int64_t last, std::int64_t cols, std::int64_t n,
               const ARow& a_row, const PanelOf& panel, std::vector<float>* seq,
               std::vector<double>* tc) {
  const std::int64_t rows = last - first;
  std::vector<float> a(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) a_row(first + r, a.data() + r * n);
  seq->resize(static_cast<std::size_t>(rows * cols));
  tc->resize(seq->size());
  ModelSums(a.data(), rows, cols, n, panel, seq->data(), tc->data());
}

// The rows of M to walk: `rows`, or all of them.
CheckedRows AllOr(const CheckedRows& rows, std::int64_t m) {
  if (!rows.empty()) return rows;
  CheckedRows all(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) all[static_cast<std::size_t>(i)] = i;
  return all;
}

// fn(first, last, check) for contiguous parts of the rows [0, n) of a block
// of `elements` elements, on threads when it pays (ForRowsInParallel), each
// part counting into a CandidateCheck of its own, merged into *check.
template <typename Fn>
void CheckRowsInParallel(std::int64_t n, std::int64_t elements, CandidateCheck* check,
                         const Fn& fn) {
  const int threads = reference_internal::RowThreads(n, elements);
  if (threads <= 1) {
    fn(0, n, check);
    return;
  }
  std::vector<CandidateCheck> parts;
  for (int t = 0; t < threads; ++t) parts.emplace_back(check->dtype());
  reference_internal::ForRowsInParallel(n, elements,
                                        [&](std::int64_t first, std::int64_t last, int part) {
                                          fn(first, last, &parts[static_cast<std::size_t>(part)]);
                                        });
  for (const CandidateCheck& p : parts) check->Merge(p);
}

// The block of rows walk[b0, b0 + n) judged on the engine's device
// (Fp64Products::JudgeXWt, JudgeGW) when it has one and every operand of
// the block is finite (the weight's the caller has looked at): true when
// it was, with its figures added to *check.
bool JudgedOnDevice(const LmHeadInputs& in, bool transposed, const std::vector<double>& operand,
                    const CheckedRows& walk, std::size_t b0, std::size_t n, const void* candidate,
                    const void* own, const judgement::ProductRule& rule, CandidateCheck* check) {
  if (in.products == nullptr) return false;
  for (double d : operand) {
    if (!std::isfinite(d)) return false;
  }
  CheckFigures figures;
  const std::int64_t m = static_cast<std::int64_t>(n);
  const bool judged = transposed ? in.products->JudgeXWt(operand.data(), walk.data() + b0, m,
                                                         candidate, own, rule, &figures)
                                 : in.products->JudgeGW(operand.data(), walk.data() + b0, m,
                                                        candidate, own, rule, &figures);
  if (judged) check->AddCounted(figures);
  return judged;
}

// The rows walk[] in blocks. Where the engine judges (and `device_ok`:
// every value of W it uses is finite), blocks of the rows it asks for
// (Fp64Products::JudgeBlockRows of `cols`) go to it whole; a block it
// cannot judge, or every block without such an engine, goes to
// host_block(b0, n, operand) in parts of at most host_rows rows.
// operand(b0, n) gives the rows' operand as doubles (x, or g). False when
// `stop` ended the walk.
template <typename Operand, typename HostBlock>
bool WalkBlocks(const LmHeadInputs& in, bool transposed, const CheckedRows& walk,
                std::int64_t host_rows, std::int64_t cols, bool device_ok, const void* candidate,
                const void* own, const judgement::ProductRule& rule, CandidateCheck* check,
                const StopCheck& stop, const Operand& operand, const HostBlock& host_block) {
  const std::int64_t device_rows =
      device_ok && in.products != nullptr ? in.products->JudgeBlockRows(cols) : 0;
  const std::size_t step = static_cast<std::size_t>(std::max(host_rows, device_rows));
  for (std::size_t b0 = 0; b0 < walk.size(); b0 += step) {
    if (stop && stop()) return false;
    const std::size_t n = std::min(walk.size() - b0, step);
    if (device_rows > 0 &&
        JudgedOnDevice(in, transposed, operand(b0, n), walk, b0, n, candidate, own, rule, check)) {
      continue;
    }
    for (std::size_t h0 = b0; h0 < b0 + n; h0 += static_cast<std::size_t>(host_rows)) {
      if (stop && stop()) return false;
      const std::size_t hn = std::min(b0 + n - h0, static_cast<std::size_t>(host_rows));
      host_block(h0, hn, operand(h0, hn));
    }
  }
  return true;
}

}  // namespace

namespace {

// W's classes of rows (by_rows) or of columns, kept in the engine's memo.
std::int64_t WeightClasses(const LmHeadInputs& in, bool by_rows) {
  const auto count = [&] {
    return DistinctClasses(in.v, in.k, by_rows,
                           [&](std::int64_t j, std::int64_t c) { return in.w[j * in.k + c]; });
  };
  if (in.products == nullptr) return count();
  return in.products->WeightCount(by_rows ? WeightMemo::kRowClasses : WeightMemo::kColumnClasses,
                                  count);
}

}  // namespace

std::int64_t WeightRowClasses(const LmHeadInputs& in) { return WeightClasses(in, true); }
std::int64_t WeightColumnClasses(const LmHeadInputs& in) { return WeightClasses(in, false); }

std::int64_t InputColumnClasses(const LmHeadInputs& in) {
  return DistinctClasses(in.m, in.k, false,
                         [&](std::int64_t i, std::int64_t c) { return in.x[i * in.k + c]; });
}

namespace {

// Rows of W with a NaN or an infinity, unless the engine has seen none.
std::vector<std::int64_t> NonFiniteWeightRows(const LmHeadInputs& in) {
  std::vector<std::int64_t> rows;
  if (in.products != nullptr && in.products->WeightFinite()) return rows;
  for (std::int64_t j = 0; j < in.v; ++j) {
    if (reference_internal::AnyNonFiniteBf16(in.w + j * in.k, in.k)) rows.push_back(j);
  }
  return rows;
}

// The host's blocks of CheckGradInput's rows walk[]: G's rows from dY as
// doubles, their products with W and models, the elements where G or W
// holds a NaN or an infinity by hand (bad_w_cols: W's columns with one).
struct GradInputHost {
  const LmHeadInputs& in;
  const CheckedRows& walk;
  const std::vector<std::int64_t>& bad_w_cols;
  const judgement::ProductRule& rule;
  const void* candidate;
  const void* own;
  DType dtype;
  CandidateCheck* check;
  std::vector<double> ref, abs;

  // A block's rows of G = bf16(dY) as doubles, the rows on threads.
  std::vector<double> GRows(std::size_t b0, std::size_t n) const {
    const std::int64_t v = in.v;
    std::vector<double> g(n * static_cast<std::size_t>(v));
    reference_internal::ForRowsInParallel(
        static_cast<std::int64_t>(n), static_cast<std::int64_t>(n) * v,
        [&](std::int64_t first, std::int64_t last, int /*part*/) {
          for (std::int64_t r = first; r < last; ++r) {
            double* row = g.data() + r * v;
            const std::int64_t at = walk[b0 + static_cast<std::size_t>(r)] * v;
            for (std::int64_t j = 0; j < v; ++j) row[j] = GAt(in, at + j);
          }
        });
    return g;
  }

  // Judges the rows walk[b0, b0 + n) of dX from their rows of G (GRows).
  void Block(std::size_t b0, std::size_t n, const std::vector<double>& g) {
    const std::int64_t v = in.v, k = in.k;
    // W's columns [c0, c0 + count) as a panel [V][count] for the models.
    const PanelOf w_columns = [&](std::int64_t c0, std::int64_t count, float* panel) {
      for (std::int64_t j = 0; j < v; ++j) {
        for (std::int64_t l = 0; l < count; ++l) {
          panel[j * count + l] = Bf16ToFloat(in.w[j * k + c0 + l]);
        }
      }
    };
    ref.resize(n * static_cast<std::size_t>(k));
    abs.resize(ref.size());
    FormGW(in.products, g, static_cast<std::int64_t>(n), Bf16Matrix{in.w, v, k}, ref.data(),
           abs.data());
    // The models of the block's rows, on threads.
    std::vector<float> seq(n * static_cast<std::size_t>(k));
    std::vector<double> tc(seq.size());
    reference_internal::ForRowsInParallel(
        static_cast<std::int64_t>(n), static_cast<std::int64_t>(n) * v * k / 64,
        [&](std::int64_t first, std::int64_t last, int /*part*/) {
          std::vector<float> part_seq;
          std::vector<double> part_tc;
          ModelRows(
              first, last, k, v,
              [&](std::int64_t r, float* out) {
                for (std::int64_t j = 0; j < v; ++j) out[j] = static_cast<float>(g[r * v + j]);
              },
              w_columns, &part_seq, &part_tc);
          std::copy(part_seq.begin(), part_seq.end(), seq.begin() + first * k);
          std::copy(part_tc.begin(), part_tc.end(), tc.begin() + first * k);
        });
    for (std::size_t r = 0; r < n; ++r) {
      const std::int64_t i = walk[b0 + r];
      double* row_ref = ref.data() + r * static_cast<std::size_t>(k);
      double* row_abs = abs.data() + r * static_cast<std::size_t>(k);
      const double* g_row = g.data() + r * static_cast<std::size_t>(v);
      const auto g_at = [&](std::int64_t j) { return g_row[j]; };
      const auto naive = [&](std::int64_t c) {
        NaiveDot(
            v, g_at, [&](std::int64_t j) { return Bf16At(in.w, j * k + c); }, &row_ref[c],
            &row_abs[c]);
      };
      if (AnyNonFinite(v, g_at)) {
        for (std::int64_t c = 0; c < k; ++c) naive(c);
      } else {
        for (std::int64_t c : bad_w_cols) naive(c);
      }
      const ClassInputs models{seq.data() + r * k, tc.data() + r * k, k};
      check->AddProducts(i * k, k, At(candidate, i * k, dtype), At(own, i * k, dtype), rule,
                         row_ref, row_abs, &models);
    }
  }
};

}  // namespace

bool CheckLogits(const LmHeadInputs& in, float alpha, const CheckedRows& rows,
                 const void* candidate, const void* own, DType dtype, CandidateCheck* check,
                 const StopCheck& stop) {
  const std::int64_t v = in.v, k = in.k;
  // With alpha, one more fp32 rounding per product (a BLAS may scale an
  // operand) or of the sum: bounds.h counts two more steps.
  const judgement::ProductRule rule = SumOfProductsRule(k, static_cast<double>(alpha), dtype);
  const std::vector<std::int64_t> bad_w = NonFiniteWeightRows(in);
  const CheckedRows walk = AllOr(rows, in.m);
  const auto x_rows = [&](std::size_t b0, std::size_t n) {
    std::vector<double> xd(n * static_cast<std::size_t>(k));
    for (std::size_t r = 0; r < n; ++r) {
      for (std::int64_t t = 0; t < k; ++t) {
        xd[r * static_cast<std::size_t>(k) + static_cast<std::size_t>(t)] =
            Bf16At(in.x, walk[b0 + r] * k + t);
      }
    }
    return xd;
  };
  // W's rows [j0, j0 + count) as a panel [K][count] for the models.
  const PanelOf w_rows = [&](std::int64_t j0, std::int64_t count, float* panel) {
    for (std::int64_t l = 0; l < count; ++l) {
      for (std::int64_t t = 0; t < k; ++t) {
        panel[t * count + l] = Bf16ToFloat(in.w[(j0 + l) * k + t]);
      }
    }
  };
  std::vector<double> ref, abs;
  const auto host_block = [&](std::size_t b0, std::size_t n, const std::vector<double>& xd) {
    ref.resize(n * static_cast<std::size_t>(v));
    abs.resize(ref.size());
    FormXWt(in.products, xd, static_cast<std::int64_t>(n), Bf16Matrix{in.w, v, k}, ref.data(),
            abs.data());
    const auto check_rows = [&](std::int64_t first, std::int64_t last, CandidateCheck* part) {
      std::vector<float> seq;
      std::vector<double> tc;
      ModelRows(
          first, last, v, k,
          [&](std::int64_t r, float* out) {
            for (std::int64_t t = 0; t < k; ++t) out[t] = static_cast<float>(xd[r * k + t]);
          },
          w_rows, &seq, &tc);
      for (std::int64_t r = first; r < last; ++r) {
        const std::int64_t i = walk[b0 + static_cast<std::size_t>(r)];
        double* row_ref = ref.data() + r * v;
        double* row_abs = abs.data() + r * v;
        const auto x_at = [&](std::int64_t t) { return Bf16At(in.x, i * k + t); };
        const auto naive = [&](std::int64_t j) {
          NaiveDot(
              k, x_at, [&](std::int64_t t) { return Bf16At(in.w, j * k + t); }, &row_ref[j],
              &row_abs[j]);
        };
        if (AnyNonFinite(k, x_at)) {
          for (std::int64_t j = 0; j < v; ++j) naive(j);
        } else {
          for (std::int64_t j : bad_w) naive(j);
        }
        const ClassInputs models{seq.data() + (r - first) * v, tc.data() + (r - first) * v, v};
        part->AddProducts(i * v, v, At(candidate, i * v, dtype), At(own, i * v, dtype), rule,
                          row_ref, row_abs, &models);
      }
    };
    CheckRowsInParallel(static_cast<std::int64_t>(n), static_cast<std::int64_t>(n) * v, check,
                        check_rows);
  };
  // Rows of W that are equal up to a power of two give one independent
  // error a row; rows of X the same across rows.
  const std::int64_t per_row = WeightRowClasses(in);
  const std::int64_t x_classes = DistinctClasses(
      static_cast<std::int64_t>(walk.size()), k, true, [&](std::int64_t r, std::int64_t t) {
        return in.x[walk[static_cast<std::size_t>(r)] * k + t];
      });
  check->LimitIndependent(per_row, per_row * x_classes);
  return WalkBlocks(in, /*transposed=*/true, walk,
                    std::max<std::int64_t>(1, kReferenceBlockElements / v), v, bad_w.empty(),
                    candidate, own, rule, check, stop, x_rows, host_block);
}

bool CheckGradInput(const LmHeadInputs& in, const CheckedRows& rows, const void* candidate,
                    const void* own, DType dtype, CandidateCheck* check, const StopCheck& stop) {
  const std::int64_t v = in.v, k = in.k;
  // Columns of W with a NaN or an infinity: every row's dX there by hand.
  // (One pass over W in its own order: rows with one mark their columns;
  // none when the engine has seen every value finite.)
  std::vector<bool> bad_col(static_cast<std::size_t>(k));
  const bool w_finite = in.products != nullptr && in.products->WeightFinite();
  for (std::int64_t j = 0; j < v && !w_finite; ++j) {
    if (!reference_internal::AnyNonFiniteBf16(in.w + j * k, k)) continue;
    for (std::int64_t c = 0; c < k; ++c) {
      if (!std::isfinite(Bf16At(in.w, j * k + c))) bad_col[static_cast<std::size_t>(c)] = true;
    }
  }
  std::vector<std::int64_t> bad_w_cols;
  for (std::int64_t c = 0; c < k; ++c) {
    if (bad_col[static_cast<std::size_t>(c)]) bad_w_cols.push_back(c);
  }
  const judgement::ProductRule rule = SumOfProductsRule(v, 1.0, dtype);
  CheckedRows walk = AllOr(rows, in.m);
  // Columns of W equal up to a power of two give one independent error a
  // row of dX; rows of G the same across rows.
  {
    const std::int64_t per_row = WeightColumnClasses(in);
    const std::int64_t g_classes = DistinctClasses(
        static_cast<std::int64_t>(walk.size()), v, true, [&](std::int64_t r, std::int64_t j) {
          return GBitsAt(in, walk[static_cast<std::size_t>(r)] * v + j);
        });
    check->LimitIndependent(per_row, per_row * g_classes);
  }
  // Blocks of rows judged on the engine's device from dY as it came (G
  // rounded there); the rows of a block it did not judge (a NaN or an
  // infinity in G) go the host's way below.
  const std::int64_t device_rows = bad_w_cols.empty() && in.products != nullptr
                                       ? in.products->JudgeBlockRows(std::max(v, k))
                                       : 0;
  // Counted apart, and merged last: the host's rows may come before them.
  CandidateCheck on_device(check->dtype());
  if (device_rows > 0) {
    CheckedRows left;
    for (std::size_t b0 = 0; b0 < walk.size(); b0 += static_cast<std::size_t>(device_rows)) {
      if (stop && stop()) return false;
      const std::size_t n = std::min(walk.size() - b0, static_cast<std::size_t>(device_rows));
      CheckFigures figures;
      if (in.products->JudgeGWOfDy(in.dy, in.dy_dtype == DType::kBf16, walk.data() + b0,
                                   static_cast<std::int64_t>(n), candidate, own, rule, &figures)) {
        on_device.AddCounted(figures);
        continue;
      }
      left.insert(left.end(), walk.begin() + static_cast<std::ptrdiff_t>(b0),
                  walk.begin() + static_cast<std::ptrdiff_t>(b0 + n));
    }
    if (left.empty()) {
      check->Merge(on_device);
      return true;
    }
    walk = std::move(left);
  }
  GradInputHost host{in, walk, bad_w_cols, rule, candidate, own, dtype, check, {}, {}};
  const bool walked = WalkBlocks(
      in, /*transposed=*/false, walk,
      std::max<std::int64_t>(1, kReferenceBlockElements / std::max(v, k)), std::max(v, k),
      bad_w_cols.empty(), candidate, own, rule, check, stop,
      [&](std::size_t b0, std::size_t n) { return host.GRows(b0, n); },
      [&](std::size_t b0, std::size_t n, const std::vector<double>& g) { host.Block(b0, n, g); });
  check->Merge(on_device);
  return walked;
}

namespace {

// dW judged on the engine's device, where it judges there and every value
// is finite: true when it was (*check has its counts).
bool GtXJudgedOnDevice(const LmHeadInputs& in, const void* candidate, const void* own, DType dtype,
                       CandidateCheck* check, const StopCheck& stop) {
  if (in.products == nullptr) return false;
  CandidateCheck on_device(dtype);
  if (!in.products->JudgeGtX(in.dy, in.dy_dtype == DType::kBf16, in.x, in.m, candidate, own,
                             SumOfProductsRule(in.m, 1.0, dtype), &on_device, stop)) {
    return false;
  }
  check->Merge(on_device);
  return true;
}

// The columns of G [M, V] and of X [M, K] (widened: xd) holding a NaN or an
// infinity.
void NonFiniteColumns(const LmHeadInputs& in, const std::vector<double>& xd,
                      std::vector<bool>* g_cols, std::vector<bool>* x_cols) {
  const std::int64_t m = in.m, v = in.v, k = in.k;
  g_cols->assign(static_cast<std::size_t>(v), false);
  x_cols->assign(static_cast<std::size_t>(k), false);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      if (!std::isfinite(GAt(in, i * v + j))) (*g_cols)[static_cast<std::size_t>(j)] = true;
    }
    for (std::int64_t c = 0; c < k; ++c) {
      if (!std::isfinite(xd[static_cast<std::size_t>(i * k + c)])) {
        (*x_cols)[static_cast<std::size_t>(c)] = true;
      }
    }
  }
}

}  // namespace

bool CheckGradWeight(const LmHeadInputs& in, const void* candidate, const void* own, DType dtype,
                     CandidateCheck* check, const StopCheck& stop) {
  const std::int64_t m = in.m, v = in.v, k = in.k;
  // Columns of X equal up to a power of two give one independent error a
  // row of dW; columns of G the same across rows.
  const std::int64_t per_row = InputColumnClasses(in);
  const std::int64_t g_classes = DistinctClasses(
      m, v, false, [&](std::int64_t i, std::int64_t j) { return GBitsAt(in, i * v + j); });
  check->LimitIndependent(per_row, per_row * g_classes);
  if (GtXJudgedOnDevice(in, candidate, own, dtype, check, stop)) return true;
  if (stop && stop()) return false;
  // G is never whole on the host: its columns come a block at a time (one
  // block of dW's rows each), X is widened once.
  std::vector<double> xd(static_cast<std::size_t>(m * k));
  for (std::int64_t i = 0; i < m * k; ++i) xd[static_cast<std::size_t>(i)] = Bf16At(in.x, i);
  // Columns of G (rows of dW) and of X (columns of dW) with a NaN or an
  // infinity: those elements by hand.
  std::vector<bool> bad_g_col, bad_x_col;
  NonFiniteColumns(in, xd, &bad_g_col, &bad_x_col);
  const judgement::ProductRule rule = SumOfProductsRule(m, 1.0, dtype);
  // X's columns [c0, c0 + count) as a panel [M][count] for the models.
  const PanelOf x_columns = [&](std::int64_t c0, std::int64_t count, float* panel) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t l = 0; l < count; ++l) {
        panel[i * count + l] = static_cast<float>(xd[static_cast<std::size_t>(i * k + c0 + l)]);
      }
    }
  };
  std::vector<double> fixed_ref(static_cast<std::size_t>(k)),
      fixed_abs(static_cast<std::size_t>(k));
  ReferenceGtX(
      [&](std::int64_t col0, std::int64_t cols, double* out) {
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < cols; ++j) out[i * cols + j] = GAt(in, i * v + col0 + j);
        }
      },
      xd, m, v, k, true,
      [&](std::int64_t row0, std::int64_t rows, const double* value, const double* abs) {
        // The models of the block's rows of dW (columns of G), on threads.
        std::vector<float> seq(static_cast<std::size_t>(rows * k));
        std::vector<double> tc(seq.size());
        reference_internal::ForRowsInParallel(
            rows, rows * m * k / 64, [&](std::int64_t first, std::int64_t last, int /*part*/) {
              std::vector<float> part_seq;
              std::vector<double> part_tc;
              ModelRows(
                  first, last, k, m,
                  [&](std::int64_t r, float* out) {
                    for (std::int64_t i = 0; i < m; ++i) {
                      out[i] = static_cast<float>(GAt(in, i * v + row0 + r));
                    }
                  },
                  x_columns, &part_seq, &part_tc);
              std::copy(part_seq.begin(), part_seq.end(), seq.begin() + first * k);
              std::copy(part_tc.begin(), part_tc.end(), tc.begin() + first * k);
            });
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t j = row0 + r;
          for (std::int64_t c = 0; c < k; ++c) {
            double ref = value[r * k + c];
            double a = abs[r * k + c];
            if (bad_g_col[static_cast<std::size_t>(j)] || bad_x_col[static_cast<std::size_t>(c)]) {
              NaiveDot(
                  m, [&](std::int64_t i) { return GAt(in, i * v + j); },
                  [&](std::int64_t i) { return xd[static_cast<std::size_t>(i * k + c)]; }, &ref,
                  &a);
            }
            fixed_ref[static_cast<std::size_t>(c)] = ref;
            fixed_abs[static_cast<std::size_t>(c)] = a;
          }
          const ClassInputs models{seq.data() + r * k, tc.data() + r * k, k};
          check->AddProducts(j * k, k, At(candidate, j * k, dtype), At(own, j * k, dtype), rule,
                             fixed_ref.data(), fixed_abs.data(), &models);
        }
      },
      kReferenceBlockElements, stop);
  return !(stop && stop());
}

void CheckTokenValues(const std::vector<double>& values, const std::vector<double>& bounds,
                      const std::vector<double>& envelopes, const CheckedRows& rows,
                      const float* candidate, const float* own, std::int64_t independent,
                      CandidateCheck* check, std::int64_t drawn_from) {
  // Reference j is the candidate's element rows[j] when it holds one value
  // per sampled row; else (every row, or the reduced loss [1]) element j. A
  // sample of one row is a sample: its value is that row's.
  const bool whole = rows.empty() || values.size() != rows.size();
  const auto at = [&](std::size_t j) { return whole ? static_cast<std::int64_t>(j) : rows[j]; };
  if (whole) {
    check->AddRange(0, static_cast<std::int64_t>(values.size()), candidate, own, values.data(),
                    bounds.data(), bounds.data());
  } else {
    for (std::size_t j = 0; j < values.size(); ++j) {
      const std::int64_t i = at(j);
      check->Add(i, candidate + i, own + i, values[j], bounds[j], bounds[j]);
    }
  }
  for (std::size_t j = 0; j < envelopes.size(); ++j) {
    const std::int64_t i = at(j);
    check->AddValueClass(i, candidate[i], values[j], envelopes[j], bounds[j], own[i]);
  }
  if (!envelopes.empty()) {
    check->LimitIndependent(1, independent);
    check->set_class_drawn_from(drawn_from);
  }
}

}  // namespace logitd
