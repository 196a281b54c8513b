// A POSIX shared-memory object for the same-host path of a logitd server
// started with --allow_shm: created with shm_open (mode 0600, so only this
// user, which must be the server's, can open it), sized with ftruncate and
// mapped read-write; unmapped, closed and unlinked when the object goes.
// Register it with Client::RegisterShm, then name slices of it in calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace logitd::client {

class SharedRegion {
 public:
  // A new object of `bytes` (> 0) bytes, zero-filled. `name` is a shm_open
  // name ("/something", no further '/'); empty picks a fresh
  // "/logitd-<pid>-<n>-<random>". AlreadyExists when the name is taken.
  static absl::StatusOr<SharedRegion> Create(std::uint64_t bytes, std::string name = "");

  SharedRegion() = default;
  ~SharedRegion();
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  // The shm_open name the server opens.
  const std::string& name() const { return name_; }
  std::uint64_t size() const { return size_; }
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void Reset();

  std::string name_;
  std::uint64_t size_ = 0;
  std::byte* data_ = nullptr;
  int fd_ = -1;
};

}  // namespace logitd::client
