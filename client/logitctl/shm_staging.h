// --shm for logitctl's tensor commands: the call's tensors staged in one
// shared-memory region of this process (the server maps it; same host and
// user, server --allow_shm), so that none of their bytes travel over gRPC.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/client.h"
#include "logitd/shared_region.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {

// Lay out first (Reserve), then Open (the region created and registered),
// then Put the inputs, make the call with Slot()s, and Take the outputs
// back. The region is released and unlinked when this goes; Close() does it
// earlier and says whether the release went through.
class ShmStaging {
 public:
  explicit ShmStaging(client::Client& client) : client_(client) {}
  ~ShmStaging();
  ShmStaging(const ShmStaging&) = delete;
  ShmStaging& operator=(const ShmStaging&) = delete;

  // Room for `bytes` at the next 64-byte boundary; returns its offset.
  std::uint64_t Reserve(std::uint64_t bytes);
  absl::Status Open();
  // The slot at `offset`, with `t`'s bytes copied there first.
  client::ShmSlot Put(const Tensor& t, std::uint64_t offset);
  client::ShmSlot Slot(std::uint64_t offset);
  // An output the server wrote, copied out of the region and checked
  // against the digest it announced (DataLoss when the bytes changed since).
  absl::StatusOr<Tensor> Take(const client::ShmOutput& output) const;
  absl::Status Close();

 private:
  client::Client& client_;
  std::uint64_t size_ = 0;
  std::optional<client::SharedRegion> region_;
  std::string handle_;
};

// Rows of the weight `handle` (its V), from ListWeights; NotFound when it is
// not registered.
absl::StatusOr<std::int64_t> WeightRows(client::Client& c, const std::string& handle);

}  // namespace logitd::logitctl
