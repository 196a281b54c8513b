#include "logitd/wire/chunk_message.h"

#include <cstring>
#include <utility>

#include "google/protobuf/stubs/common.h"

namespace logitd::wire {
namespace {

// Protobuf wire format: a field's tag is (number << 3) | type; type 0 is a
// varint, type 2 a length-delimited field (varint length, then the bytes).
constexpr std::uint8_t kChunkField = (2 << 3) | 2;   // oneof field 2, TensorChunk
constexpr std::uint8_t kNameField = (1 << 3) | 2;    // TensorChunk.name
constexpr std::uint8_t kOffsetField = (2 << 3) | 0;  // TensorChunk.offset
constexpr std::uint8_t kDataField = (3 << 3) | 2;    // TensorChunk.data
constexpr int kMaxVarintBytes = 10;

std::size_t VarintSize(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

std::uint8_t* PutVarint(std::uint64_t v, std::uint8_t* p) {
  while (v >= 0x80) {
    *p++ = static_cast<std::uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<std::uint8_t>(v);
  return p;
}

// Reads forward through a message's slices; every read fails (false) rather
// than run past the end.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices_) left_ += s.size();
  }

  std::uint64_t left() const { return left_; }

  bool Byte(std::uint8_t* b) {
    if (left_ == 0) return false;
    Skip();
    *b = slices_[i_].begin()[pos_];
    Advance(1);
    return true;
  }

  bool Varint(std::uint64_t* v) {
    *v = 0;
    for (int shift = 0, n = 0; n < kMaxVarintBytes; ++n, shift += 7) {
      std::uint8_t b = 0;
      if (!Byte(&b)) return false;
      *v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // Hands the next n bytes to `piece` as they lie in the slices.
  template <typename Piece>
  bool Take(std::uint64_t n, Piece&& piece) {
    if (n > left_) return false;
    while (n > 0) {
      Skip();
      const std::size_t here = std::min<std::uint64_t>(n, slices_[i_].size() - pos_);
      piece(reinterpret_cast<const std::byte*>(slices_[i_].begin()) + pos_, here);
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  // Moves past exhausted (or empty) slices; only called with bytes left.
  void Skip() {
    while (pos_ == slices_[i_].size()) {
      ++i_;
      pos_ = 0;
    }
  }
  void Advance(std::size_t n) {
    pos_ += n;
    left_ -= n;
  }

  const std::vector<grpc::Slice>& slices_;
  std::size_t i_ = 0;
  std::size_t pos_ = 0;
  std::uint64_t left_ = 0;
};

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

bool ReadChunkMessage(const grpc::ByteBuffer& message, ChunkView* view) {
  view->name.clear();
  view->offset = 0;
  view->pieces.clear();
  view->size = 0;
  view->message_bytes = 0;
  view->slices.clear();
  if (!message.Dump(&view->slices).ok()) return false;
  Cursor c(view->slices);
  view->message_bytes = c.left();
  std::uint8_t tag = 0;
  std::uint64_t len = 0;
  // The whole message is the one chunk field, nothing before or after it.
  if (!c.Byte(&tag) || tag != kChunkField || !c.Varint(&len) || len != c.left()) return false;
  bool seen_name = false;
  bool seen_offset = false;
  bool seen_data = false;
  while (c.left() > 0) {
    if (!c.Byte(&tag)) return false;
    if (tag == kNameField && !seen_name) {
      seen_name = true;
      std::uint64_t n = 0;
      if (!c.Varint(&n) || n > c.left()) return false;
      view->name.reserve(static_cast<std::size_t>(n));
      c.Take(n, [&](const std::byte* p, std::size_t k) {
        view->name.append(reinterpret_cast<const char*>(p), k);
      });
      // A proto3 string: protobuf refuses one that is not UTF-8, so must this.
      if (!google::protobuf::internal::IsStructurallyValidUTF8(
              view->name.data(), static_cast<int>(view->name.size()))) {
        return false;
      }
    } else if (tag == kOffsetField && !seen_offset) {
      seen_offset = true;
      if (!c.Varint(&view->offset)) return false;
    } else if (tag == kDataField && !seen_data) {
      seen_data = true;
      std::uint64_t n = 0;
      if (!c.Varint(&n) || n > c.left()) return false;
      view->size = n;
      c.Take(n, [&](const std::byte* p, std::size_t k) { view->pieces.emplace_back(p, k); });
    } else {
      // Repeated or unknown fields: protobuf's parser knows the rules.
      return false;
    }
  }
  return true;
}

grpc::ByteBuffer ChunkMessage(absl::string_view name, std::uint64_t offset, const std::byte* data,
                              std::size_t size, const std::shared_ptr<const void>& owner) {
  const std::uint64_t inner = 1 + VarintSize(name.size()) + name.size() +
                              (offset != 0 ? 1 + VarintSize(offset) : 0) + 1 + VarintSize(size) +
                              size;
  const std::size_t head_bytes = 1 + VarintSize(inner) + static_cast<std::size_t>(inner - size);
  grpc::Slice head(head_bytes);
  auto* p = const_cast<std::uint8_t*>(head.begin());
  *p++ = kChunkField;
  p = PutVarint(inner, p);
  *p++ = kNameField;
  p = PutVarint(name.size(), p);
  if (!name.empty()) std::memcpy(p, name.data(), name.size());
  p += name.size();
  if (offset != 0) {
    *p++ = kOffsetField;
    p = PutVarint(offset, p);
  }
  *p++ = kDataField;
  p = PutVarint(size, p);
  if (size == 0) return grpc::ByteBuffer(&head, 1);
  grpc::Slice slices[2] = {
      std::move(head),
      grpc::Slice(const_cast<std::byte*>(data), size, &ReleaseOwner,
                  new std::shared_ptr<const void>(owner)),
  };
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace logitd::wire
