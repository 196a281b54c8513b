// Tensors named on a command line as "FILE[:TENSOR]" in safetensors files,
// for logitctl's commands and `logitctl verify`: the file taken whole when
// it exists (paths may contain ':'), else the part after the last ':' names
// the tensor, which may be left out when the file holds exactly one.
#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "logitd/tensor.h"

namespace logitd::tensor_files {

// A tensor and its name in the file it came from.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// {FILE, TENSOR} of a reference; TENSOR empty when not given.
std::pair<std::string, std::string> SplitTensorRef(const std::string& ref);

// The tensor `name` of the safetensors file `path`, or its only tensor when
// `name` is empty. Errors start with `flag`, the option the file came from.
absl::StatusOr<NamedTensor> LoadTensor(const std::string& path, std::string name,
                                       absl::string_view flag);

// As LoadTensor for a "FILE[:TENSOR]" reference; InvalidArgument when `ref`
// is empty, i.e. `flag` was not given.
absl::StatusOr<NamedTensor> LoadTensorRef(const std::string& ref, absl::string_view flag);

}  // namespace logitd::tensor_files
