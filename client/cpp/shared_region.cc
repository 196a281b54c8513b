#include "logitd/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace logitd::client {
namespace {

std::string FreshName() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  const std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("/logitd-%d-%d-%016x", getpid(), counter.fetch_add(1), r);
}

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Create(std::uint64_t bytes, std::string name) {
  if (bytes == 0 || bytes > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared region size: expected 1 byte or more, got ", bytes));
  }
  if (name.empty()) name = FreshName();
  if (name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared region name: expected '/' then a name without '/', got '", name, "'"));
  }
  SharedRegion region;
  // O_EXCL: never adopt (and later unlink) an object someone else made.
  region.fd_ = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (region.fd_ < 0) {
    const int err = errno;
    const std::string what = absl::StrCat("shared region '", name, "': shm_open: ", strerror(err));
    return err == EEXIST ? absl::AlreadyExistsError(what) : absl::InternalError(what);
  }
  region.name_ = name;  // from here on the destructor unlinks it
  if (ftruncate(region.fd_, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("shared region '", name, "': ftruncate to ",
                                                     bytes, " bytes: ", strerror(errno)));
  }
  void* base = mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                    region.fd_, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shared region '", name, "': mmap of ", bytes, " bytes: ", strerror(errno)));
  }
  region.data_ = static_cast<std::byte*>(base);
  region.size_ = bytes;
  return region;
}

SharedRegion::~SharedRegion() { Reset(); }

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : name_(std::move(other.name_)),
      size_(std::exchange(other.size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      fd_(std::exchange(other.fd_, -1)) {
  other.name_.clear();
}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    other.name_.clear();
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void SharedRegion::Reset() {
  if (data_ != nullptr) munmap(data_, static_cast<std::size_t>(size_));
  if (fd_ >= 0) close(fd_);
  if (!name_.empty()) shm_unlink(name_.c_str());
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
  name_.clear();
}

}  // namespace logitd::client
