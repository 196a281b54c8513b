// FifoMutex: the waiting threads get it in the order they asked, and the
// thread that just unlocked cannot take it back ahead of them.
#include "server/kernels/fifo_mutex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace logitd::kernels {
namespace {

// Waits until `n` callers hold or wait for the mutex.
void WaitForQueued(const FifoMutex& mu, std::uint64_t n) {
  while (mu.queued() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(FifoMutex, WaitersGetItInTheOrderTheyAsked) {
  FifoMutex mu;
  std::mutex order_mu;
  std::vector<int> order;
  mu.lock();
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      std::lock_guard<FifoMutex> hold(mu);
      std::lock_guard<std::mutex> note(order_mu);
      order.push_back(i);
    });
    // The next thread asks only once this one waits.
    WaitForQueued(mu, static_cast<std::uint64_t>(i) + 2);
  }
  mu.unlock();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(mu.queued(), 0u);
}

// A thread that holds the mutex in many short turns (a call's row blocks)
// gets each next turn only after the threads already waiting.
TEST(FifoMutex, TheLastHolderCannotTakeItBackAheadOfAWaiter) {
  FifoMutex mu;
  std::mutex order_mu;
  std::vector<char> order;
  mu.lock();
  std::thread waiter([&] {
    std::lock_guard<FifoMutex> hold(mu);
    std::lock_guard<std::mutex> note(order_mu);
    order.push_back('w');
  });
  WaitForQueued(mu, 2);
  mu.unlock();
  mu.lock();  // at once: still behind the waiter
  {
    std::lock_guard<std::mutex> note(order_mu);
    order.push_back('h');
  }
  mu.unlock();
  waiter.join();
  EXPECT_EQ(order, (std::vector<char>{'w', 'h'}));
}

TEST(FifoMutex, ManyThreadsManyTurnsEachExclusive) {
  FifoMutex mu;
  int inside = 0;
  int most_inside = 0;
  long total = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int turn = 0; turn < 500; ++turn) {
        std::lock_guard<FifoMutex> hold(mu);
        most_inside = std::max(most_inside, ++inside);
        ++total;
        --inside;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(most_inside, 1);
  EXPECT_EQ(total, 8 * 500);
  EXPECT_EQ(mu.queued(), 0u);
}

}  // namespace
}  // namespace logitd::kernels
