#include "client/logitctl/common.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/common/connection_flags.h"
#include "client/common/exit_codes.h"
#include "client/logitctl/flags.h"
#include "logitd/bf16.h"
#include "logitd/safetensors.h"

namespace logitd::logitctl {

// --- output helpers ----------------------------------------------------------

int UsageError(absl::string_view message) {
  std::cerr << "logitctl: " << message << "\nrun 'logitctl help' for usage\n";
  return kExitUsage;
}

int InputError(const absl::Status& status) {
  std::cerr << "logitctl: " << status.message() << "\n";
  return kExitUsage;
}

int ServerError(const absl::Status& status) {
  std::cerr << "logitctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return exit_codes::ForStatus(status);
}

void PrintRows(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  for (const auto& [k, v] : rows) {
    std::cout << k << std::string(width - k.size() + 2, ' ') << (v.empty() ? "-" : v) << "\n";
  }
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

std::string Hex64(std::uint64_t v) { return absl::StrFormat("%016x", v); }

std::string Bytes(std::uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%d (%.2f GiB)", n, n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%d (%.2f MiB)", n, n / double(1ull << 20));
  return absl::StrCat(n);
}

void AppendTiming(const client::Timing& t, std::vector<std::pair<std::string, std::string>>* rows) {
  rows->emplace_back("queue_us", absl::StrCat(t.queue_us));
  rows->emplace_back("receive_us", absl::StrCat(t.receive_us));
  rows->emplace_back("h2d_us", absl::StrCat(t.h2d_us));
  rows->emplace_back("compute_us", absl::StrCat(t.compute_us));
  rows->emplace_back("d2h_us", absl::StrCat(t.d2h_us));
}

// --- files --------------------------------------------------------------------

// The server takes bf16 operands. An fp32 file is rounded once (nearest even,
// as the server's own cast does) and the user is told, since the bits sent
// are then not the bits in the file.
absl::StatusOr<Tensor> ToBf16(NamedTensor t, absl::string_view what) {
  if (t.tensor.dtype() == DType::kBf16) return std::move(t.tensor);
  if (t.tensor.dtype() != DType::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", t.name, "': expected bf16 or fp32, got ", DTypeName(t.tensor.dtype())));
  }
  Tensor out(DType::kBf16, t.tensor.shape());
  const float* src = t.tensor.data<float>();
  Bf16Bits* dst = out.data<Bf16Bits>();
  for (std::int64_t i = 0; i < out.numel(); ++i) dst[i] = FloatToBf16(src[i]);
  std::cerr << "logitctl: " << what << " '" << t.name << "' " << ShapeString(out.shape())
            << " is not bf16 in the file (read as fp32; f16 widens exactly); converted to bf16 "
               "(round to nearest even)\n";
  return out;
}

absl::Status WriteOutput(const std::string& path,
                         const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  absl::Status s = WriteSafetensors(path, tensors, metadata);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--out: ", s.message()));
  return s;
}

// --- connection ---------------------------------------------------------------

absl::StatusOr<client::ClientOptions> ConnectionOptions() {
  return client::ClientOptionsFromFlags();
}

absl::StatusOr<std::unique_ptr<client::Client>> Connect() {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return options.status();
  return client::Client::Create(absl::GetFlag(FLAGS_server), *std::move(options));
}

absl::StatusOr<DType> ParseDTypeFlag(absl::string_view flag, const std::string& value,
                                     std::initializer_list<DType> allowed) {
  absl::StatusOr<DType> d = ParseDType(value);
  if (d.ok()) {
    for (DType a : allowed) {
      if (*d == a) return d;
    }
  }
  std::vector<std::string> names;
  for (DType a : allowed) names.emplace_back(DTypeName(a));
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": expected ", absl::StrJoin(names, " or "), ", got '", value, "'"));
}

absl::StatusOr<client::Reduction> ParseReduction(const std::string& value) {
  const std::string v = absl::AsciiStrToLower(value);
  for (client::Reduction r :
       {client::Reduction::kMean, client::Reduction::kSum, client::Reduction::kNone}) {
    if (v == client::ReductionName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--reduction: expected mean, sum or none, got '", value, "'"));
}

}  // namespace logitd::logitctl
