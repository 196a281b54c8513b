#include "server/service/call/row_blocks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logitd/tensor.h"

namespace logitd::service {

void InputProgress::Expect(absl::string_view name, std::uint64_t bytes, std::int64_t m) {
  absl::MutexLock lock(&mu_);
  inputs_.push_back(Input{std::string(name), bytes, m});
}

void InputProgress::Landed(absl::string_view name, std::uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    for (Input& in : inputs_) {
      if (in.name != name) continue;
      in.landed = std::max(in.landed, bytes);
      // Whole rows only: bytes / (bytes per row), in integers that cannot
      // overflow (rows * bytes per row = landed * m / bytes).
      const std::uint64_t row_bytes = in.m > 0 ? in.bytes / static_cast<std::uint64_t>(in.m) : 0;
      in.rows_in = row_bytes == 0 ? in.m : static_cast<std::int64_t>(in.landed / row_bytes);
    }
  }
  changed_.SignalAll();
}

void InputProgress::Ended(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    status_ = std::move(status);
  }
  changed_.SignalAll();
}

absl::Status InputProgress::WaitRows(std::int64_t rows) {
  absl::MutexLock lock(&mu_);
  const auto in_place = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Input& in : inputs_) {
      if (in.rows_in < std::min(rows, in.m)) return false;
    }
    return true;
  };
  while (!in_place() && !ended_) changed_.Wait(&mu_);
  if (!status_.ok()) return status_;
  if (in_place()) return absl::OkStatus();
  return absl::InternalError("the request stream ended OK before every row of its inputs arrived");
}

absl::Status InputProgress::WaitInput(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  const auto in_place = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Input& in : inputs_) {
      if (in.name == name && in.rows_in < in.m) return false;
    }
    return true;
  };
  while (!in_place() && !ended_) changed_.Wait(&mu_);
  if (!status_.ok()) return status_;
  if (in_place()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the request stream ended OK before all of '", name, "' arrived"));
}

absl::Status InputProgress::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::vector<std::uint64_t> BlockDigests(const std::byte* data, std::uint64_t bytes,
                                        const std::vector<std::int64_t>& shape,
                                        std::int64_t* block_rows) {
  const std::int64_t rows = shape.empty() || shape[0] <= 0 ? 1 : shape[0];
  const std::uint64_t row_bytes = bytes / static_cast<std::uint64_t>(rows);
  *block_rows = (rows + kMaxDigestBlocks - 1) / kMaxDigestBlocks;
  std::vector<std::uint64_t> out;
  for (std::int64_t first = 0; first < rows; first += *block_rows) {
    const std::int64_t n = std::min(*block_rows, rows - first);
    out.push_back(Xxh3(data + static_cast<std::uint64_t>(first) * row_bytes,
                       static_cast<std::size_t>(static_cast<std::uint64_t>(n) * row_bytes)));
  }
  return out;
}

}  // namespace logitd::service
