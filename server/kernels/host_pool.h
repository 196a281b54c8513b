// A cache of large host buffers whose allocation is expensive (page-locked
// memory on the cuda backend: cudaHostAlloc and cudaFreeHost of a 128 MiB
// response buffer cost milliseconds each, on every call). Buffers handed out
// return to the pool when their HostBuffer is destroyed; the pool keeps up to
// `cache_bytes` of them and frees the rest. A request is served from the
// smallest cached buffer that holds it and is at most a quarter (plus one
// rounding step) larger, so a small call never pins a huge buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/kernels/backend.h"

namespace logitd::kernels {

class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  // Allocates at least `bytes` (the pool asks for rounded sizes), or fails
  // with the status the caller should see.
  using AllocateFn = std::function<absl::StatusOr<std::byte*>(std::size_t bytes)>;
  using FreeFn = std::function<void(std::byte*)>;

  // Sizes are rounded up to this step, so buffers of nearby sizes are shared.
  static constexpr std::size_t kRoundBytes = std::size_t{2} << 20;

  static std::shared_ptr<HostBufferPool> Create(std::uint64_t cache_bytes, AllocateFn allocate,
                                                FreeFn free);
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // A buffer of `bytes` (HostBuffer::size() is `bytes`); it goes back to the
  // pool when the HostBuffer is destroyed, even after the pool's owner let go.
  absl::StatusOr<HostBuffer> Get(std::size_t bytes);

  struct Stats {
    std::uint64_t hits = 0;          // served from the cache
    std::uint64_t misses = 0;        // newly allocated
    std::uint64_t cached_bytes = 0;  // held, not handed out
    std::uint64_t cached_buffers = 0;
  };
  Stats stats() const;

 private:
  HostBufferPool(std::uint64_t cache_bytes, AllocateFn allocate, FreeFn free);
  void Put(std::byte* data, std::size_t capacity);

  const std::uint64_t cache_bytes_;
  const AllocateFn allocate_;
  const FreeFn free_;
  mutable absl::Mutex mu_;
  std::multimap<std::size_t, std::byte*> free_buffers_ ABSL_GUARDED_BY(mu_);  // by capacity
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::kernels
