// Which rows a check takes: Verify's sample of rows, the tokens the
// per-token outputs' precision-class test draws, and how many distinct
// tokens rows hold (verify_checks.h).
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "logitd/reference/verify_checks.h"
#include "logitd/tensor.h"

namespace logitd {

CheckedRows SampleRows(std::int64_t m, std::int64_t count, std::uint64_t seed) {
  if (count <= 0 || count >= m) return {};
  CheckedRows rows;
  if (seed == 0) {
    count = std::max<std::int64_t>(count, 2);
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t i = j * (m - 1) / (count - 1);
      if (rows.empty() || rows.back() != i) rows.push_back(i);
    }
    return rows;
  }
  // Floyd's sampling: count distinct rows, each subset equally likely.
  std::uint64_t state = seed;
  const auto next = [&state] {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::set<std::int64_t> chosen;
  for (std::int64_t j = m - count; j < m; ++j) {
    const std::int64_t t = static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(j + 1));
    chosen.insert(chosen.count(t) ? j : t);
  }
  return CheckedRows(chosen.begin(), chosen.end());
}

std::vector<std::uint8_t> ClassTokenRows(const std::int64_t* targets, std::int64_t m,
                                         std::int64_t ignore_index, std::int64_t cap,
                                         std::uint64_t seed) {
  if (m <= cap) return {};
  std::vector<std::int64_t> counted, others;
  for (std::int64_t i = 0; i < m; ++i) {
    (targets == nullptr || targets[i] != ignore_index ? counted : others).push_back(i);
  }
  // Never SampleRows' lattice (seed 0): a draw whatever the caller's seed.
  constexpr std::uint64_t kClassSeed = 0x636c617373746f6bull;
  const std::uint64_t mixed = (seed ^ kClassSeed) != 0 ? seed ^ kClassSeed : kClassSeed;
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(m), 0);
  const auto draw = [&](const std::vector<std::int64_t>& from, std::int64_t count) {
    const std::int64_t n = static_cast<std::int64_t>(from.size());
    const CheckedRows picked = SampleRows(n, count, mixed);
    if (picked.empty()) {  // all of them
      for (std::int64_t i : from) mask[static_cast<std::size_t>(i)] = 1;
      return;
    }
    for (std::int64_t j : picked)
      mask[static_cast<std::size_t>(from[static_cast<std::size_t>(j)])] = 1;
  };
  const std::int64_t from_counted =
      std::min<std::int64_t>(cap, static_cast<std::int64_t>(counted.size()));
  if (from_counted > 0) draw(counted, from_counted);
  if (cap > from_counted) draw(others, cap - from_counted);
  return mask;
}

DistinctTokenCounts CountDistinctTokens(const LmHeadInputs& in, const std::int64_t* targets,
                                        const std::uint8_t* rows) {
  std::vector<std::uint64_t> pairs, alone;
  pairs.reserve(static_cast<std::size_t>(in.m));
  alone.reserve(static_cast<std::size_t>(in.m));
  for (std::int64_t i = 0; i < in.m; ++i) {
    if (rows != nullptr && rows[i] == 0) continue;
    const std::uint64_t x = Xxh3(in.x + i * in.k, static_cast<std::size_t>(in.k) * 2);
    const std::uint64_t row[2] = {x,
                                  static_cast<std::uint64_t>(targets != nullptr ? targets[i] : 0)};
    pairs.push_back(Xxh3(row, sizeof row));
    alone.push_back(x);
  }
  const auto distinct = [](std::vector<std::uint64_t>* h) {
    std::sort(h->begin(), h->end());
    return static_cast<std::int64_t>(std::unique(h->begin(), h->end()) - h->begin());
  };
  return DistinctTokenCounts{distinct(&pairs), distinct(&alone)};
}

std::int64_t DistinctTokens(const LmHeadInputs& in, const std::int64_t* targets,
                            const std::uint8_t* rows) {
  return CountDistinctTokens(in, targets, rows).with_targets;
}

}  // namespace logitd
