#include "logitd/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"

namespace logitd {
namespace {

// Tensor bytes are stored in host order; the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;
constexpr std::size_t kNamesInMessage = 8;
constexpr absl::string_view kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct Header {
  std::uint64_t data_start = 0;  // file offset of byte 0 of the data section
  std::vector<Entry> entries;    // in data order
  std::map<std::string, std::string> metadata;
};

// Bytes per element of every dtype the format defines, so a file is fully
// validated even when it holds tensors logitd cannot read. 0: unknown.
std::uint64_t SafetensorsDTypeSize(absl::string_view dtype) {
  static const std::map<std::string, std::uint64_t, std::less<>> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "BF16";
    case DType::kFp32:
      return "F32";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
  }
  return "?";
}

// Exact: fp16's range and precision lie inside fp32's.
float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// errno as a Status (ENOENT -> NotFound, EACCES -> PermissionDenied, ...);
// a failure that left errno unset still must not read as OK.
absl::Status IoError(int err, absl::string_view what) {
  return absl::ErrnoToStatus(err != 0 ? err : EIO, what);
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": not a valid safetensors file: ", what));
}

// A JSON number that is a non-negative integer (nlohmann parses those as
// unsigned).
bool AsCount(const nlohmann::json& j, std::uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<std::uint64_t>();
  return true;
}

absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                                 const nlohmann::json& j, std::uint64_t data_size) {
  Entry e;
  e.name = name;
  if (!j.is_object()) return Corrupt(path, absl::StrCat("entry '", name, "' is not an object"));
  auto dtype = j.find("dtype");
  if (dtype == j.end() || !dtype->is_string()) {
    return Corrupt(path, absl::StrCat("entry '", name, "' has no string \"dtype\""));
  }
  e.dtype = dtype->get<std::string>();
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array()) {
    return Corrupt(path, absl::StrCat("entry '", name, "' has no array \"shape\""));
  }
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const nlohmann::json& d : *shape) {
    std::uint64_t dim = 0;
    if (!AsCount(d, &dim) || dim > static_cast<std::uint64_t>(INT64_MAX)) {
      return Corrupt(path, absl::StrCat("entry '", name, "' has a shape entry ", d.dump(),
                                        ", expected a non-negative integer"));
    }
    e.shape.push_back(static_cast<std::int64_t>(dim));
    if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim) overflow = true;
    numel *= dim;
  }
  // A zero dim makes the tensor empty however large the others are.
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
    numel = 0;
    overflow = false;
  }
  auto offsets = j.find("data_offsets");
  if (offsets == j.end() || !offsets->is_array() || offsets->size() != 2 ||
      !AsCount((*offsets)[0], &e.begin) || !AsCount((*offsets)[1], &e.end)) {
    return Corrupt(path, absl::StrCat("entry '", name,
                                      "' needs \"data_offsets\": [begin, end] of non-negative "
                                      "integers"));
  }
  if (e.begin > e.end || e.end > data_size) {
    return Corrupt(path, absl::StrFormat("entry '%s' has data_offsets [%d, %d], expected "
                                         "0 <= begin <= end <= %d (the data section's size)",
                                         name, e.begin, e.end, data_size));
  }
  const std::uint64_t element_size = SafetensorsDTypeSize(e.dtype);
  if (element_size != 0) {
    if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / element_size ||
        numel * element_size != e.end - e.begin) {
      return Corrupt(
          path, absl::StrFormat("entry '%s' is %s %s, expected %s bytes, but its "
                                "data_offsets [%d, %d] span %d bytes",
                                name, e.dtype, ShapeString(e.shape),
                                overflow ? "more than 2^64" : absl::StrCat(numel * element_size),
                                e.begin, e.end, e.end - e.begin));
    }
  }
  return e;
}

absl::StatusOr<Header> ReadHeader(const std::string& path, std::ifstream& in) {
  errno = 0;
  in.open(path, std::ios::binary);
  if (!in) return IoError(errno, absl::StrCat("cannot open '", path, "'"));
  in.seekg(0, std::ios::end);
  const std::streamoff file_size_s = in.tellg();
  if (file_size_s < 0) return Corrupt(path, "cannot determine the file size");
  const auto file_size = static_cast<std::uint64_t>(file_size_s);
  if (file_size < 8) {
    return Corrupt(path, absl::StrFormat("file is %d bytes, too short for the 8-byte header "
                                         "length",
                                         file_size));
  }
  in.seekg(0);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  if (!in) return Corrupt(path, "cannot read the header length");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    return Corrupt(
        path, absl::StrFormat("header length %d, expected at most %d and at most the "
                              "%d bytes that follow it in the file",
                              header_len, std::min(kMaxHeaderBytes, file_size - 8), file_size - 8));
  }
  std::string text(static_cast<std::size_t>(header_len), '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  if (!in) return Corrupt(path, "cannot read the header");

  Header h;
  h.data_start = 8 + header_len;
  const std::uint64_t data_size = file_size - h.data_start;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt(path, "the header is not valid JSON");
  if (!j.is_object()) return Corrupt(path, "the header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) return Corrupt(path, "\"__metadata__\" is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Corrupt(path,
                         absl::StrCat("\"__metadata__\" value of '", m.key(), "' is not a string"));
        }
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    absl::StatusOr<Entry> e = ParseEntry(path, it.key(), *it, data_size);
    if (!e.ok()) return e.status();
    h.entries.push_back(std::move(*e));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  return h;
}

// Reads [offset, offset + size) of the file into dst.
absl::Status ReadBytes(const std::string& path, std::ifstream& in, std::uint64_t offset,
                       std::uint64_t size, void* dst) {
  if (size == 0) return absl::OkStatus();
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(size));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != size) {
    return absl::DataLossError(
        absl::StrFormat("%s: read of %d bytes at offset %d came up short", path, size, offset));
  }
  return absl::OkStatus();
}

// The entry named `name`; NotFound listing some of the file's tensors.
absl::StatusOr<const Entry*> FindEntry(const std::string& path, const Header& h,
                                       const std::string& name) {
  auto it = std::find_if(h.entries.begin(), h.entries.end(),
                         [&](const Entry& e) { return e.name == name; });
  if (it != h.entries.end()) return &*it;
  std::vector<absl::string_view> some;
  for (std::size_t i = 0; i < h.entries.size() && i < kNamesInMessage; ++i) {
    some.push_back(h.entries[i].name);
  }
  return absl::NotFoundError(absl::StrFormat(
      "%s: no tensor '%s'; the file has %d tensor(s): %s%s", path, name, h.entries.size(),
      absl::StrJoin(some, ", "), h.entries.size() > kNamesInMessage ? ", ..." : ""));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListSafetensors(const std::string& path) {
  std::ifstream in;
  absl::StatusOr<Header> h = ReadHeader(path, in);
  if (!h.ok()) return h.status();
  std::vector<std::string> names;
  names.reserve(h->entries.size());
  for (const Entry& e : h->entries) names.push_back(e.name);
  return names;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(
    const std::string& path) {
  std::ifstream in;
  absl::StatusOr<Header> h = ReadHeader(path, in);
  if (!h.ok()) return h.status();
  return std::move(h->metadata);
}

absl::StatusOr<SafetensorsTensorInfo> StatSafetensorsTensor(const std::string& path,
                                                            const std::string& name) {
  std::ifstream in;
  absl::StatusOr<Header> h = ReadHeader(path, in);
  if (!h.ok()) return h.status();
  absl::StatusOr<const Entry*> found = FindEntry(path, *h, name);
  if (!found.ok()) return found.status();
  SafetensorsTensorInfo info;
  info.dtype = (*found)->dtype;
  info.shape = (*found)->shape;
  return info;
}

absl::StatusOr<Tensor> ReadSafetensorsTensor(const std::string& path, const std::string& name) {
  std::ifstream in;
  absl::StatusOr<Header> h = ReadHeader(path, in);
  if (!h.ok()) return h.status();
  absl::StatusOr<const Entry*> found = FindEntry(path, *h, name);
  if (!found.ok()) return found.status();
  const Entry& e = **found;
  const std::uint64_t offset = h->data_start + e.begin;
  const std::uint64_t size = e.end - e.begin;

  if (e.dtype == "F16") {
    Tensor t(DType::kFp32, e.shape);
    std::vector<std::uint16_t> half(static_cast<std::size_t>(t.numel()));
    if (absl::Status s = ReadBytes(path, in, offset, size, half.data()); !s.ok()) return s;
    float* out = t.data<float>();
    for (std::size_t i = 0; i < half.size(); ++i) out[i] = HalfToFloat(half[i]);
    return t;
  }
  DType dtype;
  if (e.dtype == "BF16") {
    dtype = DType::kBf16;
  } else if (e.dtype == "F32") {
    dtype = DType::kFp32;
  } else if (e.dtype == "I32") {
    dtype = DType::kInt32;
  } else if (e.dtype == "I64") {
    dtype = DType::kInt64;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", name, "' has dtype ", e.dtype,
                     ", expected one of BF16, F32, F16 (read as fp32), I32, I64"));
  }
  Tensor t(dtype, e.shape);
  if (absl::Status s = ReadBytes(path, in, offset, size, t.bytes()); !s.ok()) return s;
  return t;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "' is null"));
    }
    if (name.empty() || name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: expected a non-empty tensor name other than __metadata__, got '", name,
          "'"));
    }
    // A default-constructed Tensor has no shape and no bytes; the header
    // would claim one element.
    std::uint64_t numel = 1;
    for (std::int64_t d : tensor->shape()) numel *= static_cast<std::uint64_t>(d);
    if (numel * ElementSize(tensor->dtype()) != tensor->nbytes()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("safetensors: tensor '%s' %s %s holds %d bytes, expected %d", name,
                          DTypeName(tensor->dtype()), ShapeString(tensor->shape()),
                          tensor->nbytes(), numel * ElementSize(tensor->dtype())));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name '", name, "' appears twice"));
    }
    nlohmann::json entry;
    entry["dtype"] = std::string(SafetensorsDTypeName(tensor->dtype()));
    entry["shape"] = tensor->shape();
    entry["data_offsets"] = {offset, offset + tensor->nbytes()};
    header[name] = std::move(entry);
    offset += tensor->nbytes();
  }
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() rejects names or metadata that are not valid UTF-8.
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: cannot encode the header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));

  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IoError(errno, absl::StrCat("cannot create '", tmp, "'"));
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, tensor] : tensors) {
      out.write(reinterpret_cast<const char*>(tensor->bytes()),
                static_cast<std::streamsize>(tensor->nbytes()));
    }
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::remove(tmp.c_str());
      return IoError(err, absl::StrCat("cannot write '", tmp, "'"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return IoError(err, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace logitd
