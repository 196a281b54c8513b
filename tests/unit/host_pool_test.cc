#include "server/kernels/host_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "absl/status/status.h"

namespace logitd::kernels {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// malloc/free with a ledger, so the tests can tell what the pool allocated,
// freed and still holds.
struct Ledger {
  std::set<std::byte*> live;
  int allocations = 0;
  int frees = 0;
  std::size_t fail_above = 0;  // refuse allocations larger than this (0: never)
  std::vector<std::size_t> sizes;
};

std::shared_ptr<HostBufferPool> MakePool(Ledger* ledger, std::uint64_t cache_bytes) {
  return HostBufferPool::Create(
      cache_bytes,
      [ledger](std::size_t bytes) -> absl::StatusOr<std::byte*> {
        if (ledger->fail_above != 0 && bytes > ledger->fail_above) {
          return absl::ResourceExhaustedError("test: no memory");
        }
        auto* p = static_cast<std::byte*>(std::malloc(bytes));
        ledger->live.insert(p);
        ledger->allocations += 1;
        ledger->sizes.push_back(bytes);
        return p;
      },
      [ledger](std::byte* p) {
        EXPECT_EQ(ledger->live.erase(p), 1u) << "freed a pointer the pool did not allocate";
        ledger->frees += 1;
        std::free(p);
      });
}

TEST(HostBufferPool, ReusesAReturnedBufferForTheSameSize) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 64 * kMiB);
  std::byte* first = nullptr;
  {
    absl::StatusOr<HostBuffer> b = pool->Get(5 * kMiB + 3);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->size(), 5 * kMiB + 3);
    std::memset(b->data(), 0x5a, b->size());  // the whole size is usable
    first = b->data();
  }
  EXPECT_EQ(pool->stats().cached_buffers, 1u);
  absl::StatusOr<HostBuffer> again = pool->Get(5 * kMiB);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(ledger.allocations, 1);
  EXPECT_EQ(pool->stats().hits, 1u);
  EXPECT_EQ(pool->stats().misses, 1u);
  // Sizes are rounded to the pool's step.
  EXPECT_EQ(ledger.sizes[0] % HostBufferPool::kRoundBytes, 0u);
  EXPECT_GE(ledger.sizes[0], 5 * kMiB + 3);
}

TEST(HostBufferPool, ASmallRequestDoesNotTakeAMuchLargerBuffer) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 512 * kMiB);
  { ASSERT_TRUE(pool->Get(128 * kMiB).ok()); }
  absl::StatusOr<HostBuffer> small = pool->Get(2 * kMiB);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(ledger.allocations, 2);
  EXPECT_EQ(pool->stats().cached_bytes, 128 * kMiB);
}

TEST(HostBufferPool, KeepsAtMostItsCacheBytesAndFreesTheRest) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 10 * kMiB);
  {
    absl::StatusOr<HostBuffer> a = pool->Get(4 * kMiB);
    absl::StatusOr<HostBuffer> b = pool->Get(6 * kMiB);
    absl::StatusOr<HostBuffer> c = pool->Get(8 * kMiB);
    absl::StatusOr<HostBuffer> big = pool->Get(16 * kMiB);  // alone larger than the cache
    ASSERT_TRUE(a.ok() && b.ok() && c.ok() && big.ok());
  }
  const HostBufferPool::Stats s = pool->stats();
  EXPECT_LE(s.cached_bytes, 10 * kMiB);
  EXPECT_EQ(ledger.live.size(), s.cached_buffers);
  EXPECT_EQ(ledger.frees, 4 - static_cast<int>(s.cached_buffers));
}

TEST(HostBufferPool, ZeroCacheFreesEveryBufferOnReturn) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 0);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HostBuffer> b = pool->Get(kMiB);
    ASSERT_TRUE(b.ok());
  }
  EXPECT_EQ(ledger.allocations, 3);
  EXPECT_EQ(ledger.frees, 3);
  EXPECT_TRUE(ledger.live.empty());
}

TEST(HostBufferPool, DropsTheCacheAndRetriesWhenAnAllocationFails) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 64 * kMiB);
  { ASSERT_TRUE(pool->Get(30 * kMiB).ok()); }
  ledger.fail_above = 40 * kMiB;
  absl::StatusOr<HostBuffer> refused = pool->Get(50 * kMiB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->stats().cached_bytes, 0u);  // the cache was given up first
  EXPECT_TRUE(ledger.live.empty());
}

TEST(HostBufferPool, BuffersOutliveThePoolHandleAndAreFreedOnce) {
  Ledger ledger;
  auto pool = MakePool(&ledger, 64 * kMiB);
  absl::StatusOr<HostBuffer> kept = pool->Get(3 * kMiB);
  ASSERT_TRUE(kept.ok());
  { ASSERT_TRUE(pool->Get(7 * kMiB).ok()); }
  pool.reset();  // the owner lets go; the handed-out buffer keeps the pool alive
  EXPECT_EQ(ledger.frees, 0);
  *kept = HostBuffer();  // returned: the pool goes, freeing everything it held
  EXPECT_EQ(ledger.frees, 2);
  EXPECT_TRUE(ledger.live.empty());
}

}  // namespace
}  // namespace logitd::kernels
