#include "client/common/tensor_files.h"

#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "logitd/safetensors.h"

namespace logitd::tensor_files {

std::pair<std::string, std::string> SplitTensorRef(const std::string& ref) {
  if (std::ifstream(ref).good()) return {ref, ""};
  const std::size_t colon = ref.rfind(':');
  if (colon == std::string::npos || colon == 0) return {ref, ""};
  return {ref.substr(0, colon), ref.substr(colon + 1)};
}

absl::StatusOr<NamedTensor> LoadTensor(const std::string& path, std::string name,
                                       absl::string_view flag) {
  if (name.empty()) {
    absl::StatusOr<std::vector<std::string>> names = ListSafetensors(path);
    if (!names.ok()) {
      return absl::Status(names.status().code(),
                          absl::StrCat(flag, ": ", names.status().message()));
    }
    if (names->size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' holds ", names->size(),
                                                     " tensors (", absl::StrJoin(*names, ", "),
                                                     "); name one as FILE:TENSOR"));
    }
    name = names->front();
  }
  absl::StatusOr<Tensor> t = ReadSafetensorsTensor(path, name);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(flag, ": ", t.status().message()));
  }
  return NamedTensor{name, std::move(*t)};
}

absl::StatusOr<NamedTensor> LoadTensorRef(const std::string& ref, absl::string_view flag) {
  if (ref.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is required"));
  auto [path, name] = SplitTensorRef(ref);
  return LoadTensor(path, name, flag);
}

}  // namespace logitd::tensor_files
