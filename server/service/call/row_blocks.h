// A call run in blocks of rows (Call::RunInRowBlocks): what its blocks wait
// on while the front door's thread receives the streamed inputs. Every
// input of such a call is indexed by row (X [M, K], targets [M]), so the
// first r rows of an input are its first r * bytes / M bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace logitd::service {

class InputProgress {
 public:
  // An input of `bytes` over `m` rows that arrives while blocks run.
  void Expect(absl::string_view name, std::uint64_t bytes, std::int64_t m);
  // Bytes [0, bytes) of input `name` are in place (wire::Assembler::OnLanded).
  void Landed(absl::string_view name, std::uint64_t bytes);
  // Reception ended: OK when every byte is in and matched its digest, else
  // why not. Blocks waiting for rows that will not come are woken with it.
  void Ended(absl::Status status);

  // Waits until rows [0, rows) of every expected input are in place. The
  // reception's error when it ended before they were; OK as soon as they
  // are, before their digest is checked (that is Ended's status).
  absl::Status WaitRows(std::int64_t rows);
  // Waits until every row of input `name` (as Expect named it) is in place,
  // as WaitRows; OK at once for a name not expected.
  absl::Status WaitInput(absl::string_view name);
  // Whether reception has ended, and how; OK while it has not.
  absl::Status status() const;

 private:
  struct Input {
    std::string name;
    std::uint64_t bytes = 0;
    std::int64_t m = 0;
    std::uint64_t landed = 0;
    // Rows [0, rows_in) are in place.
    std::int64_t rows_in = 0;
  };
  // mu_ guards the inputs' progress and the reception's end; changed_ is
  // signalled when either moves.
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<Input> inputs_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A tensor's digests by blocks of rows, which a recorded Verify run keeps
// instead of its bits (VerifiedCandidate::block_xxh3).

// The most blocks a candidate's digests split it in.
inline constexpr std::int64_t kMaxDigestBlocks = 64;

// `bytes` of a tensor of `shape` in blocks of rows of its first dimension
// (a scalar: one row), at most kMaxDigestBlocks of them: each block's
// xxh3-64, and the rows a block holds in *block_rows.
std::vector<std::uint64_t> BlockDigests(const std::byte* data, std::uint64_t bytes,
                                        const std::vector<std::int64_t>& shape,
                                        std::int64_t* block_rows);

}  // namespace logitd::service
