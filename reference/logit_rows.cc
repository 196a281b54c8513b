#include "logit_rows.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "logitd/bf16.h"
#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"
#include "logitd/reference/token_judgement.h"

namespace logitd::reference_internal {
namespace {

double Bf16At(const Bf16Bits* data, std::int64_t i) { return Bf16ToFloat(data[i]); }

// Σ x·w and Σ|x·w| over k in fp64, one product at a time.
void NaiveDot(const Bf16Bits* x, const Bf16Bits* w, std::int64_t k, double* sum, double* abs) {
  double s = 0, s_abs = 0;
  for (std::int64_t t = 0; t < k; ++t) {
    const double p = Bf16At(x, t) * Bf16At(w, t);
    s += p;
    s_abs += std::fabs(p);
  }
  *sum = s;
  *abs = s_abs;
}

}  // namespace

bool AnyNonFiniteBf16(const Bf16Bits* data, std::int64_t n) {
  // An exponent of all ones: (bits & 0x7f80) + 0x80 reaches 0x8000 only
  // then. An OR of 16-bit integers, which the compiler vectorises.
  std::uint32_t any = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    any |= ((static_cast<std::uint32_t>(data[t]) & 0x7f80u) + 0x80u) & 0x8000u;
  }
  return any != 0;
}

bool WidenFiniteRows(const Bf16Bits* x, const std::vector<std::int64_t>& rows, std::int64_t k,
                     std::vector<double>* out) {
  out->resize(rows.size() * static_cast<std::size_t>(k));
  double* to = out->data();
  for (const std::int64_t row : rows) {
    const Bf16Bits* from = x + row * k;
    if (AnyNonFiniteBf16(from, k)) return false;
    for (std::int64_t t = 0; t < k; ++t) *to++ = Bf16ToFloat(from[t]);
  }
  return true;
}

std::vector<RowChunk> EngineRowChunks(std::int64_t m, bool classed,
                                      const std::vector<std::uint8_t>& class_rows,
                                      std::int64_t size) {
  std::vector<RowChunk> chunks;
  const auto add = [&](bool drawn, bool chunk_classed) {
    for (std::int64_t i = 0; i < m; ++i) {
      if (drawn && class_rows[static_cast<std::size_t>(i)] == 0) continue;
      if (!drawn && !class_rows.empty() && class_rows[static_cast<std::size_t>(i)] != 0) continue;
      if (chunks.empty() || chunks.back().classed != chunk_classed ||
          static_cast<std::int64_t>(chunks.back().rows.size()) >= size) {
        chunks.push_back(RowChunk{{}, chunk_classed});
      }
      chunks.back().rows.push_back(i);
    }
  };
  if (classed && !class_rows.empty()) {
    add(/*drawn=*/true, /*chunk_classed=*/true);
    add(/*drawn=*/false, /*chunk_classed=*/false);  // a chunk of their own
  } else {
    add(/*drawn=*/false, classed);
  }
  return chunks;
}

bool FormRows(std::int64_t m, std::int64_t block, std::int64_t engine_rows, bool classed,
              const std::vector<std::uint8_t>& class_rows,
              const std::function<bool(const RowChunk&)>& engine,
              const std::function<void(std::int64_t, std::int64_t)>& host, const StopCheck& stop) {
  const auto host_run = [&](std::int64_t r0, std::int64_t n) {
    for (std::int64_t b0 = r0; b0 < r0 + n; b0 += block) {
      if (stop && stop()) return false;
      host(b0, std::min(block, r0 + n - b0));
    }
    return true;
  };
  if (engine_rows <= 0) return host_run(0, m);
  for (const RowChunk& chunk : EngineRowChunks(m, classed, class_rows, engine_rows)) {
    if (stop && stop()) return false;
    if (engine(chunk)) continue;
    // The chunk's runs of consecutive rows on the host.
    const std::vector<std::int64_t>& rows = chunk.rows;
    for (std::size_t a = 0; a < rows.size();) {
      std::size_t b = a + 1;
      while (b < rows.size() && rows[b] == rows[b - 1] + 1) ++b;
      if (!host_run(rows[a], static_cast<std::int64_t>(b - a))) return false;
      a = b;
    }
  }
  return true;
}

int RowThreads(std::int64_t n, std::int64_t elements) {
  constexpr std::int64_t kMaxThreads = 16;
  constexpr std::int64_t kElementsPerThread = std::int64_t{1} << 18;
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max<std::int64_t>(
      1, std::min({kMaxThreads, hardware, n, elements / kElementsPerThread})));
}

void ForRowsInParallel(std::int64_t n, std::int64_t elements,
                       const std::function<void(std::int64_t, std::int64_t, int)>& fn) {
  const int threads = RowThreads(n, elements);
  if (threads <= 1) {
    fn(0, n, 0);
    return;
  }
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] { fn(n * t / threads, n * (t + 1) / threads, t); });
  }
  for (std::thread& w : workers) w.join();
}

std::int64_t DefaultBlockRows(std::int64_t v) {
  return std::max<std::int64_t>(1, kReferenceBlockElements / std::max<std::int64_t>(1, v));
}

LogitRows::LogitRows(const LmHeadInputs& in, LogitModel model) : in_(in), model_(model) {
  // Rows of W with a NaN or an infinity, unless the engine has seen none.
  if (in.products != nullptr && in.products->WeightFinite()) return;
  for (std::int64_t j = 0; j < in.v; ++j) {
    if (AnyNonFiniteBf16(in.w + j * in.k, in.k)) bad_w_.push_back(j);
  }
}

const std::uint8_t* BlockClassRows(bool classed, const std::vector<std::uint8_t>& class_rows,
                                   std::int64_t r0, std::int64_t n,
                                   std::vector<std::uint8_t>* every_row) {
  if (!classed) return nullptr;
  if (!class_rows.empty()) return class_rows.data() + r0;
  every_row->assign(static_cast<std::size_t>(n), 1);
  return every_row->data();
}

void LogitRows::Compute(std::int64_t row0, std::int64_t n, std::vector<double>* y,
                        std::vector<double>* y_err, std::vector<double>* y_class,
                        const std::uint8_t* class_rows) const {
  const std::int64_t v = in_.v, k = in_.k;
  const bool bounded = model_ == LogitModel::kFp32Sum;
  std::vector<double> xd(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < n * k; ++i) {
    xd[static_cast<std::size_t>(i)] = Bf16At(in_.x, row0 * k + i);
  }
  y->assign(static_cast<std::size_t>(n * v), 0.0);
  if (bounded) {
    y_err->assign(y->size(), 0.0);
  } else {
    y_err->clear();
  }
  FormXWt(in_.products, xd, n, Bf16Matrix{in_.w, v, k}, y->data(),
          bounded ? y_err->data() : nullptr);
  // The elements a dgemm may get wrong: every one of a row of X with a NaN
  // or an infinity, and those of the rows of W with one.
  for (std::int64_t r = 0; r < n; ++r) {
    const Bf16Bits* x_row = in_.x + (row0 + r) * k;
    double* y_row = y->data() + r * v;
    double* abs_row = bounded ? y_err->data() + r * v : nullptr;
    const auto naive = [&](std::int64_t j) {
      double abs = 0;
      NaiveDot(x_row, in_.w + j * k, k, &y_row[j], &abs);
      if (abs_row != nullptr) abs_row[j] = abs;
    };
    if (AnyNonFiniteBf16(x_row, k)) {
      for (std::int64_t j = 0; j < v; ++j) naive(j);
    } else {
      for (std::int64_t j : bad_w_) naive(j);
    }
  }
  if (bounded && y_class != nullptr) ClassEnvelopes(row0, n, *y, *y_err, class_rows, y_class);
  if (bounded) {
    // The proven bound of an fp32 sum of K products (bounds.h).
    const double gamma = Gamma(k, kFp32StepError) + Gamma(k + 1, kFp64UnitRoundoff);
    const double absolute = 2 * static_cast<double>(k) * kFp32Underflow;
    for (double& e : *y_err) e = e * gamma + absolute;
  } else if (model_ == LogitModel::kBf16Rounded) {
    for (double& value : *y) value = RoundDoubleToBf16(value);
  }
}

void LogitRows::ClassEnvelopes(std::int64_t row0, std::int64_t n, const std::vector<double>& y,
                               const std::vector<double>& y_abs, const std::uint8_t* class_rows,
                               std::vector<double>* y_class) const {
  const std::int64_t v = in_.v, k = in_.k;
  y_class->assign(y.size(), 0.0);
  std::vector<std::int64_t> picked;
  for (std::int64_t r = 0; r < n; ++r) {
    if (class_rows == nullptr || class_rows[r] != 0) picked.push_back(r);
  }
  const std::int64_t count = static_cast<std::int64_t>(picked.size());
  if (count == 0) return;
  const double floor = judgement::ClassFloor(k);
  const PanelOf w_rows = [&](std::int64_t j0, std::int64_t cols, float* panel) {
    for (std::int64_t l = 0; l < cols; ++l) {
      for (std::int64_t t = 0; t < k; ++t) {
        panel[t * cols + l] = Bf16ToFloat(in_.w[(j0 + l) * k + t]);
      }
    }
  };
  // Parts of the picked rows, each one ModelSums of its rows gathered.
  ForRowsInParallel(count, count * v * std::max<std::int64_t>(1, k / 16),
                    [&](std::int64_t first, std::int64_t last, int /*part*/) {
                      const std::int64_t rows = last - first;
                      std::vector<float> a(static_cast<std::size_t>(rows * k));
                      for (std::int64_t q = 0; q < rows; ++q) {
                        const Bf16Bits* x_row =
                            in_.x + (row0 + picked[static_cast<std::size_t>(first + q)]) * k;
                        for (std::int64_t t = 0; t < k; ++t) {
                          a[static_cast<std::size_t>(q * k + t)] = Bf16ToFloat(x_row[t]);
                        }
                      }
                      std::vector<float> seq(static_cast<std::size_t>(rows * v));
                      std::vector<double> tc(seq.size());
                      ModelSums(a.data(), rows, v, k, w_rows, seq.data(), tc.data());
                      for (std::int64_t q = 0; q < rows; ++q) {
                        const std::int64_t r = picked[static_cast<std::size_t>(first + q)];
                        for (std::int64_t j = 0; j < v; ++j) {
                          const std::size_t at = static_cast<std::size_t>(r * v + j);
                          const std::size_t from = static_cast<std::size_t>(q * v + j);
                          (*y_class)[at] = judgement::LogitClassEnvelope(
                              y[at], y_abs[at], seq[from], tc[from], floor);
                        }
                      }
                    });
}

}  // namespace logitd::reference_internal
