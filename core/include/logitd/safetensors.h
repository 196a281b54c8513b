// Reading and writing safetensors files, the checkpoint format the server
// loads weights from: an 8-byte little-endian header length, a JSON header
// giving each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/tensor.h"

namespace logitd {

// Error codes shared by the readers: NotFound when the file or the tensor
// does not exist (the message lists the tensors the file has);
// DataLoss when the file is not a well-formed safetensors file (header
// length past the file or over 100 MB, invalid JSON, byte ranges out of
// bounds or not matching shape x dtype); InvalidArgument for a dtype logitd
// cannot represent.

// Tensor names in the order their data lies in the file.
absl::StatusOr<std::vector<std::string>> ListSafetensors(const std::string& path);

// The header's "__metadata__" string map (empty when there is none).
absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(const std::string& path);

// What the header says of one tensor, without its data.
struct SafetensorsTensorInfo {
  // The file's dtype string: "BF16", "F32", "F16", "I64", ...
  std::string dtype;
  std::vector<std::int64_t> shape;
};

// Reads only the header (the file's data is not touched), so a caller can
// check a tensor's dtype and shape, and charge for its size, before reading it.
absl::StatusOr<SafetensorsTensorInfo> StatSafetensorsTensor(const std::string& path,
                                                            const std::string& name);

// Reads one tensor, seeking to its bytes so a large checkpoint is never read
// whole. BF16, F32, I32 and I64 come back as stored; F16 is widened to fp32
// exactly (every fp16 value is an fp32 value).
absl::StatusOr<Tensor> ReadSafetensorsTensor(const std::string& path, const std::string& name);

// Writes the tensors in the given order, with an optional "__metadata__" map.
// The header is padded with spaces to 8-byte alignment as the reference
// implementation does. The file is written under a temporary name and
// renamed into place, so readers never see a partial file.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace logitd
