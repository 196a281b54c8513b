#include "logitd/wire/wire.h"

#include <xxhash.h>
#ifdef LOGITD_HAVE_XXH_DISPATCH
// XXH3_64bits and XXH3_64bits_update become their runtime-dispatched (AVX2,
// AVX-512) versions: the same digests, faster (see LogitdDependencies.cmake).
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstring>
#include <deque>
#include <new>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace logitd::wire {

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      return DType::kBf16;
    case v1::DTYPE_FP32:
      return DType::kFp32;
    case v1::DTYPE_INT32:
      return DType::kInt32;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", v1::DType_Name(dtype), " (", static_cast<int>(dtype),
                       ") is not a tensor dtype: expected BF16, FP32, INT32 or INT64"));
  }
}

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return v1::DTYPE_BF16;
    case DType::kFp32:
      return v1::DTYPE_FP32;
    case DType::kInt32:
      return v1::DTYPE_INT32;
    case DType::kInt64:
      return v1::DTYPE_INT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::TensorSpec MakeSpec(absl::string_view name, const Tensor& tensor) {
  v1::TensorSpec spec;
  spec.set_name(std::string(name));
  spec.set_dtype(ToProto(tensor.dtype()));
  for (std::int64_t d : tensor.shape()) spec.add_shape(d);
  spec.set_xxh3(tensor.Digest());
  return spec;
}

// A tensor being received. Large ones are filled and hashed by a thread of
// their own: the receiving thread checks each chunk and queues it (a chunk
// read from gRPC's slices is queued with the slices themselves, so its bytes
// are copied by the worker; a parsed chunk is copied first and queued for
// hashing only), and goes back to reading the socket while the worker copies
// and then hashes the chunk while it is still in cache. Small tensors are
// copied and hashed piece by piece on the receiving thread.
struct Assembler::Pending {
  Tensor tensor;              // the tensor received, unless `external`
  std::byte* data = nullptr;  // where its bytes go: tensor.bytes() or the caller's memory
  std::uint64_t size = 0;     // its byte count
  bool external = false;      // announced with ExpectInto
  std::uint64_t expected_digest = 0;
  bool digest_given = false;   // in its spec, or by SetExpectedDigest
  std::uint64_t received = 0;  // bytes accepted (checked and queued or copied)
  XXH3_state_t* state = nullptr;
  std::string name;
  const Landed* landed = nullptr;  // the Assembler's, when set
  std::uint64_t copied = 0;        // bytes in place (the worker's, while it runs)
  bool taken = false;

  struct Work {
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    ChunkView view;  // pieces to copy first; none when already copied
  };
  // At most this many chunks wait for the worker; the receiver waits beyond.
  static constexpr std::size_t kMaxQueued = 8;

  std::thread worker;
  absl::Mutex mu;
  absl::CondVar more;   // work queued, or closed
  absl::CondVar space;  // the queue shrank
  // The chunks waiting for the worker, and whether more can come; mu guards
  // both.
  std::deque<Work> queue ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  ~Pending() {
    StopWorker();
    if (state != nullptr) XXH3_freeState(state);
  }

  void StartWorker() {
    worker = std::thread([this] {
      for (;;) {
        Work w;
        {
          absl::MutexLock lock(&mu);
          while (queue.empty() && !closed) more.Wait(&mu);
          if (queue.empty()) return;  // closed, and everything done
          w = std::move(queue.front());
          queue.pop_front();
        }
        space.Signal();
        if (w.view.pieces.empty()) {
          // Copied on the receiving thread already.
          XXH3_64bits_update(state, data + w.offset, w.size);
        } else {
          // Each piece is copied, then hashed while it is still in cache: a
          // chunk (4 MiB) is larger than a core's cache, its pieces are not.
          std::byte* dst = data + w.offset;
          for (const absl::Span<const std::byte> piece : w.view.pieces) {
            std::memcpy(dst, piece.data(), piece.size());
            XXH3_64bits_update(state, dst, piece.size());
            dst += piece.size();
          }
        }
        copied = w.offset + w.size;
        if (landed != nullptr) (*landed)(name, copied);
      }
    });
  }

  void Queue(Work w) {
    {
      absl::MutexLock lock(&mu);
      while (queue.size() >= kMaxQueued) space.Wait(&mu);
      queue.push_back(std::move(w));
    }
    more.Signal();
  }

  // Waits until the worker has done every queued chunk; then the tensor and
  // `state` are this thread's again.
  void StopWorker() {
    if (!worker.joinable()) return;
    {
      absl::MutexLock lock(&mu);
      closed = true;
    }
    more.Signal();
    worker.join();
  }
};

Assembler::Assembler(std::uint64_t max_total_bytes) : max_total_bytes_(max_total_bytes) {}
Assembler::~Assembler() = default;

absl::Status Assembler::Expect(const v1::TensorSpec& spec, Tensor* recycle) {
  return Announce(spec, recycle, nullptr, 0);
}

absl::Status Assembler::ExpectInto(const v1::TensorSpec& spec, std::byte* into,
                                   std::uint64_t capacity) {
  return Announce(spec, nullptr, into, capacity);
}

absl::Status Assembler::Announce(const v1::TensorSpec& spec, Tensor* recycle, std::byte* into,
                                 std::uint64_t capacity) {
  if (spec.name().empty()) return absl::InvalidArgumentError("tensor spec without a name");
  if (pending_.count(spec.name()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name(), "' announced twice"));
  }
  absl::StatusOr<DType> dtype = FromProto(spec.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name(), ": ", dtype.status().message()));
  }
  std::vector<std::int64_t> shape(spec.shape().begin(), spec.shape().end());
  if (shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name(), ": shape has no dimensions"));
  }
  absl::StatusOr<std::int64_t> nbytes = CheckedByteCount(shape, *dtype);
  if (!nbytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name(), ": ", nbytes.status().message()));
  }
  const auto n = static_cast<std::uint64_t>(*nbytes);
  if (n > max_total_bytes_ || total_bytes_ > max_total_bytes_ - n) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s %s %s is %d bytes; with the request's other tensors (%d bytes) that exceeds the "
        "limit of %d bytes per request (server flag --max_request_bytes)",
        spec.name(), DTypeName(*dtype), ShapeString(shape), n, total_bytes_, max_total_bytes_));
  }
  auto p = std::make_unique<Pending>();
  if (into != nullptr) {
    if (capacity < n) {
      return absl::InternalError(absl::StrFormat(
          "%s: %d bytes do not fit the %d-byte buffer given for them", spec.name(), n, capacity));
    }
    p->data = into;
    p->external = true;
  } else {
    // Every byte is written by Add before Take hands the tensor out.
    if (recycle != nullptr && recycle->dtype() == *dtype && recycle->shape() == shape) {
      p->tensor = std::move(*recycle);
    } else {
      absl::StatusOr<Tensor> t = Tensor::CreateUninitialized(*dtype, std::move(shape));
      if (!t.ok()) return t.status();
      p->tensor = std::move(*t);
    }
    p->data = p->tensor.bytes();
  }
  p->size = n;
  p->name = spec.name();
  if (landed_) p->landed = &landed_;
  p->expected_digest = spec.xxh3();
  p->digest_given = spec.xxh3() != 0;
  p->state = XXH3_createState();
  if (p->state == nullptr || XXH3_64bits_reset(p->state) != XXH_OK) {
    return absl::ResourceExhaustedError("cannot allocate a digest state");
  }
  if (n >= kHashAsideBytes) p->StartWorker();
  total_bytes_ += n;
  pending_.emplace(spec.name(), std::move(p));
  return absl::OkStatus();
}

absl::Status Assembler::Add(const v1::TensorChunk& chunk) {
  const absl::Span<const std::byte> data(reinterpret_cast<const std::byte*>(chunk.data().data()),
                                         chunk.data().size());
  return AddPieces(chunk.name(), chunk.offset(), data.size(), {&data, 1}, nullptr);
}

absl::Status Assembler::Add(ChunkView&& chunk) {
  return AddPieces(chunk.name, chunk.offset, chunk.size, chunk.pieces, &chunk);
}

absl::Status Assembler::AddPieces(absl::string_view name, std::uint64_t offset, std::uint64_t len,
                                  absl::Span<const absl::Span<const std::byte>> pieces,
                                  ChunkView* view) {
  auto it = pending_.find(name);
  if (it == pending_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for tensor '", name, "', which this call did not announce"));
  }
  Pending& p = *it->second;
  const std::uint64_t size = p.size;
  if (offset != p.received) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: chunk at offset %d, expected offset %d (chunks must arrive in order)",
                        name, offset, p.received));
  }
  if (len > size - p.received) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: chunk [%d, %d) runs past the tensor's end at %d bytes", name, offset,
                        offset + len, size));
  }
  if (len == 0) {
    // Every tensor has at least one byte, so an empty chunk is never needed;
    // refused so that a sender's off-by-one shows at once.
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: empty chunk at offset %d (every chunk carries at least one byte)", name, offset));
  }
  if (p.worker.joinable()) {
    Pending::Work w;
    w.offset = offset;
    w.size = len;
    if (view != nullptr) {
      w.view = std::move(*view);  // the worker copies from gRPC's slices
    } else {
      std::byte* dst = p.data + offset;
      for (const absl::Span<const std::byte> piece : pieces) {
        std::memcpy(dst, piece.data(), piece.size());
        dst += piece.size();
      }
    }
    p.received += len;
    p.Queue(std::move(w));
    return absl::OkStatus();
  }
  // Each piece is copied, then hashed while it is still in cache.
  for (const absl::Span<const std::byte> piece : pieces) {
    if (piece.empty()) continue;
    std::byte* dst = p.data + p.received;
    std::memcpy(dst, piece.data(), piece.size());
    XXH3_64bits_update(p.state, dst, piece.size());
    p.received += piece.size();
  }
  p.copied = p.received;
  if (p.landed != nullptr) (*p.landed)(p.name, p.copied);
  return absl::OkStatus();
}

absl::Status Assembler::SetExpectedDigest(absl::string_view name, std::uint64_t xxh3) {
  auto it = pending_.find(name);
  if (it == pending_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' was announced"));
  }
  if (it->second->digest_given) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", name, "' has its digest already (its spec carried it, or a digest came before)"));
  }
  it->second->expected_digest = xxh3;
  it->second->digest_given = true;
  return absl::OkStatus();
}

std::optional<std::uint64_t> Assembler::ExpectedDigest(absl::string_view name) const {
  auto it = pending_.find(name);
  if (it == pending_.end() || !it->second->digest_given) return std::nullopt;
  return it->second->expected_digest;
}

void Assembler::StopWorkers() {
  for (const auto& [name, p] : pending_) p->StopWorker();
}

absl::Status Assembler::Finish() {
  StopWorkers();
  for (const auto& [name, p] : pending_) {
    if (p->received != p->size) {
      return absl::DataLossError(absl::StrFormat("%s: received %d of %d bytes (truncated stream)",
                                                 name, p->received, p->size));
    }
    if (!p->digest_given) {
      return absl::DataLossError(absl::StrFormat(
          "%s: its spec carried xxh3 0 and no digest followed its %d bytes", name, p->size));
    }
    const std::uint64_t got = XXH3_64bits_digest(p->state);
    if (got != p->expected_digest) {
      return absl::DataLossError(
          absl::StrFormat("%s: xxh3 digest of the received bytes is %016x, the sender announced "
                          "%016x (data corrupted in transit)",
                          name, got, p->expected_digest));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Assembler::Take(absl::string_view name) {
  auto it = pending_.find(name);
  if (it == pending_.end() || it->second->taken) {
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' was received"));
  }
  if (it->second->external) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", name, "' was received into the caller's buffer (ExpectInto)"));
  }
  if (it->second->received != it->second->size) {
    return absl::DataLossError(absl::StrFormat("%s: received %d of %d bytes (truncated stream)",
                                               name, it->second->received, it->second->size));
  }
  it->second->StopWorker();
  it->second->taken = true;
  return std::move(it->second->tensor);
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::Update(const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}
std::uint64_t Xxh3Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

absl::Status SendChunks(absl::string_view name, const std::byte* data, std::size_t size,
                        std::size_t chunk_bytes,
                        const std::function<bool(v1::TensorChunk&&)>& write) {
  v1::TensorChunk chunk;
  return SendChunksInPlace(name, data, size, chunk_bytes, &chunk,
                           [&] { return write(std::move(chunk)); });
}

absl::Status SendChunksInPlace(absl::string_view name, const std::byte* data, std::size_t size,
                               std::size_t chunk_bytes, v1::TensorChunk* chunk,
                               const std::function<bool()>& write) {
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  for (std::size_t off = 0; off < size; off += chunk_bytes) {
    const std::size_t len = std::min(chunk_bytes, size - off);
    chunk->set_name(name.data(), name.size());
    chunk->set_offset(off);
    chunk->mutable_data()->assign(reinterpret_cast<const char*>(data + off), len);
    if (!write()) {
      return absl::UnavailableError(
          absl::StrFormat("%s: the peer stopped reading at byte %d of %d", name, off, size));
    }
  }
  return absl::OkStatus();
}

}  // namespace logitd::wire
