#include "server/kernels/host_pool.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace logitd::kernels {

std::shared_ptr<HostBufferPool> HostBufferPool::Create(std::uint64_t cache_bytes,
                                                       AllocateFn allocate, FreeFn free) {
  return std::shared_ptr<HostBufferPool>(
      new HostBufferPool(cache_bytes, std::move(allocate), std::move(free)));
}

HostBufferPool::HostBufferPool(std::uint64_t cache_bytes, AllocateFn allocate, FreeFn free)
    : cache_bytes_(cache_bytes), allocate_(std::move(allocate)), free_(std::move(free)) {}

HostBufferPool::~HostBufferPool() {
  // Buffers still handed out hold a reference to the pool, so everything
  // left here is cached.
  for (const auto& [capacity, data] : free_buffers_) free_(data);
}

absl::StatusOr<HostBuffer> HostBufferPool::Get(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - kRoundBytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("host buffer of %d bytes cannot be allocated", bytes));
  }
  const std::size_t capacity =
      std::max<std::size_t>(kRoundBytes, (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes);
  std::byte* data = nullptr;
  std::size_t got = capacity;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_buffers_.lower_bound(capacity);
    if (it != free_buffers_.end() && it->first <= capacity + capacity / 4) {
      got = it->first;
      data = it->second;
      free_buffers_.erase(it);
      stats_.cached_bytes -= got;
      stats_.cached_buffers -= 1;
      stats_.hits += 1;
    } else {
      stats_.misses += 1;
    }
  }
  if (data == nullptr) {
    absl::StatusOr<std::byte*> fresh = allocate_(capacity);
    if (!fresh.ok()) {
      // Cached buffers of other sizes may be what stands in the way: give
      // them back and try once more.
      std::vector<std::byte*> drop;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [c, d] : free_buffers_) drop.push_back(d);
        free_buffers_.clear();
        stats_.cached_bytes = 0;
        stats_.cached_buffers = 0;
      }
      if (drop.empty()) return fresh.status();
      for (std::byte* d : drop) free_(d);
      fresh = allocate_(capacity);
      if (!fresh.ok()) return fresh.status();
    }
    data = *fresh;
  }
  std::shared_ptr<HostBufferPool> self = shared_from_this();
  return HostBuffer(data, bytes,
                    [self = std::move(self), got](std::byte* p) { self->Put(p, got); });
}

void HostBufferPool::Put(std::byte* data, std::size_t capacity) {
  std::vector<std::byte*> drop;
  {
    absl::MutexLock lock(&mu_);
    if (capacity > cache_bytes_) {
      drop.push_back(data);
    } else {
      // Make room by letting go of the largest cached buffers first.
      while (stats_.cached_bytes + capacity > cache_bytes_ && !free_buffers_.empty()) {
        auto largest = std::prev(free_buffers_.end());
        drop.push_back(largest->second);
        stats_.cached_bytes -= largest->first;
        stats_.cached_buffers -= 1;
        free_buffers_.erase(largest);
      }
      free_buffers_.emplace(capacity, data);
      stats_.cached_bytes += capacity;
      stats_.cached_buffers += 1;
    }
  }
  for (std::byte* d : drop) free_(d);
}

HostBufferPool::Stats HostBufferPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace logitd::kernels
