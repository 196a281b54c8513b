// GradientState: the per-weight gradient buffer and call count both
// backends keep, here over host vectors.
#include "server/kernels/gradient_state.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace logitd::kernels {
namespace {

using Buffer = std::vector<float>;

TEST(GradientState, CreatedOnceOnFirstUseAndCountedFromZero) {
  GradientState<Buffer> state(16);
  EXPECT_EQ(state.bytes(), 0u);
  int created = 0;
  auto create = [&]() -> absl::StatusOr<Buffer> {
    ++created;
    return Buffer(4, 0.0f);
  };
  {
    GradientState<Buffer>::Lock lock = state.Acquire();
    EXPECT_EQ(lock.buffer(), nullptr);
    EXPECT_EQ(lock.calls(), 0u);
    absl::StatusOr<Buffer*> buffer = lock.GetOrCreate(create);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    (**buffer)[0] += 1.0f;
    lock.CountCall();
    EXPECT_EQ(lock.buffer(), *buffer);
  }
  EXPECT_EQ(state.bytes(), 16u);
  {
    GradientState<Buffer>::Lock lock = state.Acquire();
    absl::StatusOr<Buffer*> buffer = lock.GetOrCreate(create);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ((**buffer)[0], 1.0f);
    lock.CountCall();
    EXPECT_EQ(lock.calls(), 2u);
    lock.ResetCalls();
    EXPECT_EQ(lock.calls(), 0u);
  }
  EXPECT_EQ(created, 1);
}

TEST(GradientState, FailedCreationLeavesNoBufferAndIsRetried) {
  GradientState<Buffer> state(16);
  GradientState<Buffer>::Lock lock = state.Acquire();
  absl::StatusOr<Buffer*> failed = lock.GetOrCreate(
      []() -> absl::StatusOr<Buffer> { return absl::ResourceExhaustedError("full"); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(lock.buffer(), nullptr);
  EXPECT_EQ(state.bytes(), 0u);
  absl::StatusOr<Buffer*> buffer =
      lock.GetOrCreate([]() -> absl::StatusOr<Buffer> { return Buffer(4, 0.0f); });
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(state.bytes(), 16u);
}

TEST(GradientState, CallsFromManyThreadsAllLandAndCount) {
  GradientState<Buffer> state(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&state] {
      for (int i = 0; i < 1000; ++i) {
        GradientState<Buffer>::Lock lock = state.Acquire();
        absl::StatusOr<Buffer*> buffer =
            lock.GetOrCreate([]() -> absl::StatusOr<Buffer> { return Buffer(1, 0.0f); });
        ASSERT_TRUE(buffer.ok());
        (**buffer)[0] += 1.0f;
        lock.CountCall();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  GradientState<Buffer>::Lock lock = state.Acquire();
  ASSERT_NE(lock.buffer(), nullptr);
  EXPECT_EQ((*lock.buffer())[0], 8000.0f);
  EXPECT_EQ(lock.calls(), 8000u);
}

}  // namespace
}  // namespace logitd::kernels
