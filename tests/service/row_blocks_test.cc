// InputProgress: what a call run in row blocks waits on while its inputs
// arrive on another thread.
#include "server/service/call/row_blocks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"

namespace logitd::service {
namespace {

TEST(InputProgress, RowsAreInOnceEveryInputHasThemWhole) {
  InputProgress p;
  p.Expect("x", 10 * 400, 10);      // rows of 400 bytes
  p.Expect("targets", 10 * 8, 10);  // rows of 8 bytes
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(p.WaitRows(4).ok());
    done = true;
  });
  p.Landed("x", 4 * 400 - 1);  // three whole rows and most of the fourth
  p.Landed("targets", 10 * 8);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done) << "a row counted before its last byte";
  p.Landed("x", 4 * 400);
  waiter.join();
  EXPECT_TRUE(done);
  // Rows already in do not wait; a report behind an earlier one changes nothing.
  p.Landed("x", 100);
  EXPECT_TRUE(p.WaitRows(3).ok());
}

TEST(InputProgress, AnEndedReceptionWakesWaitersWithItsStatus) {
  InputProgress p;
  p.Expect("x", 1000, 10);
  std::thread waiter([&] {
    const absl::Status s = p.WaitRows(10);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  });
  p.Landed("x", 500);
  p.Ended(absl::DataLossError("x: digest"));
  waiter.join();
  // Once reception failed, even rows that arrived are refused: the call stops.
  EXPECT_EQ(p.WaitRows(1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
}

TEST(InputProgress, AWholeInputIsWaitedForAlone) {
  // CrossEntropy waits for every target before its first block, whatever
  // X has sent by then.
  InputProgress p;
  p.Expect("x", 10 * 400, 10);
  p.Expect("labels", 10 * 8, 10);
  EXPECT_TRUE(p.WaitInput("not-expected").ok());
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(p.WaitInput("labels").ok());
    done = true;
  });
  p.Landed("labels", 9 * 8 + 7);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done) << "the input counted whole before its last byte";
  p.Landed("labels", 10 * 8);
  waiter.join();
  EXPECT_TRUE(done);
  // A reception that failed wakes a waiter with its status.
  InputProgress q;
  q.Expect("labels", 80, 10);
  std::thread failed(
      [&] { EXPECT_EQ(q.WaitInput("labels").code(), absl::StatusCode::kCancelled); });
  q.Ended(absl::CancelledError("gone"));
  failed.join();
}

TEST(InputProgress, AStreamThatEndedShortIsAnInternalError) {
  // Reception says OK only when every byte arrived; rows missing after an
  // OK end mean the caller and the receiver disagree.
  InputProgress p;
  p.Expect("x", 1000, 10);
  p.Landed("x", 300);
  p.Ended(absl::OkStatus());
  EXPECT_TRUE(p.WaitRows(3).ok());
  EXPECT_EQ(p.WaitRows(4).code(), absl::StatusCode::kInternal);
}

// A tensor's block digests: at most 64 blocks of whole rows, the last one
// short; one bit flipped changes its block's digest and no other; a scalar
// is one block of one row.
TEST(BlockDigestsTest, BlocksOfWholeRowsAndAFlipChangesOnlyItsBlock) {
  std::vector<float> t(130 * 5);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i) * 0.25f;
  const auto* bytes = reinterpret_cast<std::byte*>(t.data());
  std::int64_t block_rows = 0;
  const std::vector<std::uint64_t> before =
      BlockDigests(bytes, t.size() * 4, {130, 5}, &block_rows);
  EXPECT_EQ(block_rows, 3);       // ceil(130 / 64)
  ASSERT_EQ(before.size(), 44u);  // 43 blocks of 3 rows, and one of 1
  std::uint32_t bits;
  std::memcpy(&bits, &t[100 * 5 + 2], 4);  // row 100: block 33
  bits ^= 1u;
  std::memcpy(&t[100 * 5 + 2], &bits, 4);
  const std::vector<std::uint64_t> after = BlockDigests(bytes, t.size() * 4, {130, 5}, &block_rows);
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t b = 0; b < before.size(); ++b) EXPECT_EQ(after[b] != before[b], b == 33) << b;
  const float loss = 1.5f;
  const std::vector<std::uint64_t> scalar =
      BlockDigests(reinterpret_cast<const std::byte*>(&loss), 4, {}, &block_rows);
  EXPECT_EQ(block_rows, 1);
  EXPECT_EQ(scalar.size(), 1u);
  EXPECT_EQ(BlockDigests(bytes, 10 * 5 * 4, {10, 5}, &block_rows).size(), 10u);
  EXPECT_EQ(block_rows, 1);
}

}  // namespace
}  // namespace logitd::service
