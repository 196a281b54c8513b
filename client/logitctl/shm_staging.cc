#include "client/logitctl/shm_staging.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace logitd::logitctl {

ShmStaging::~ShmStaging() { Close().IgnoreError(); }

std::uint64_t ShmStaging::Reserve(std::uint64_t bytes) {
  const std::uint64_t offset = (size_ + 63) / 64 * 64;
  size_ = offset + bytes;
  return offset;
}

absl::Status ShmStaging::Open() {
  absl::StatusOr<client::SharedRegion> region =
      client::SharedRegion::Create(std::max<std::uint64_t>(size_, 1));
  if (!region.ok()) return region.status();
  region_ = *std::move(region);
  absl::StatusOr<std::string> handle = client_.RegisterShm(*region_);
  if (!handle.ok()) return handle.status();
  handle_ = *std::move(handle);
  return absl::OkStatus();
}

client::ShmSlot ShmStaging::Put(const Tensor& t, std::uint64_t offset) {
  std::copy_n(t.bytes(), t.nbytes(), region_->data() + offset);
  return Slot(offset);
}

client::ShmSlot ShmStaging::Slot(std::uint64_t offset) {
  return client::ShmSlot{handle_, &*region_, offset};
}

absl::StatusOr<Tensor> ShmStaging::Take(const client::ShmOutput& output) const {
  Tensor t(output.dtype, output.shape);
  std::copy_n(region_->data() + output.offset, t.nbytes(), t.bytes());
  if (t.Digest() != output.xxh3) {
    return absl::DataLossError("an output changed in shared memory after the server wrote it");
  }
  return t;
}

absl::Status ShmStaging::Close() {
  if (handle_.empty()) return absl::OkStatus();
  absl::Status released = client_.ReleaseShm(handle_);
  handle_.clear();
  return released;
}

absl::StatusOr<std::int64_t> WeightRows(client::Client& c, const std::string& handle) {
  absl::StatusOr<std::vector<client::WeightInfo>> weights = c.ListWeights();
  if (!weights.ok()) return weights.status();
  for (const client::WeightInfo& w : *weights) {
    if (w.handle == handle && w.shape.size() == 2) return w.shape[0];
  }
  return absl::NotFoundError(absl::StrCat("weight handle '", handle, "' is not registered"));
}

}  // namespace logitd::logitctl
