// What logitctl's commands share: exit codes and the errors that pick them,
// key/value and table output, safetensors input (FILE[:TENSOR]) and output,
// and the connection to the server that the common flags describe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/common/exit_codes.h"
#include "client/common/tensor_files.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {

// Exit codes (client/common/exit_codes.h): 0 success; 1 a check failed or
// the server failed the operation; 2 a usage or input error, what the
// server refuses of what was sent among them, or a server that cannot be
// reached.
constexpr int kExitOk = exit_codes::kOk;
constexpr int kExitFailed = exit_codes::kFailed;
constexpr int kExitUsage = exit_codes::kUsage;

// --- output helpers ----------------------------------------------------------

// Says `message` and where the usage is; returns kExitUsage.
int UsageError(absl::string_view message);

// Local problems (files, dtypes) are the caller's input, not the server's:
// returns kExitUsage.
int InputError(const absl::Status& status);

// A status that came back from the server, printed as "logitctl: CODE:
// message": exit_codes::ForStatus (kExitUsage for a refusal of the input or
// a server not reached, else kExitFailed).
int ServerError(const absl::Status& status);

// Prints key/value rows with the values in one column.
void PrintRows(const std::vector<std::pair<std::string, std::string>>& rows);

// Prints a table with a header row, every column padded to its widest cell.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

std::string Hex64(std::uint64_t v);

// A byte count, with GiB or MiB in parentheses from 1 MiB on.
std::string Bytes(std::uint64_t n);

// The server's time split of one call as rows.
void AppendTiming(const client::Timing& t, std::vector<std::pair<std::string, std::string>>* rows);

// --- files --------------------------------------------------------------------

// "FILE[:TENSOR]" references (client/common/tensor_files.h).
using tensor_files::LoadTensor;
using tensor_files::LoadTensorRef;
using tensor_files::NamedTensor;

// The tensor as the bf16 operand the server takes; an fp32 one is rounded
// (nearest even), with a note on stderr.
absl::StatusOr<Tensor> ToBf16(NamedTensor t, absl::string_view what);

// Writes --out; errors start with "--out: ".
absl::Status WriteOutput(const std::string& path,
                         const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                         const std::map<std::string, std::string>& metadata);

// --- connection ---------------------------------------------------------------

// The client options the connection flags ask for (deadline, chunk size,
// bearer token, TLS, load balancing), their files read.
absl::StatusOr<client::ClientOptions> ConnectionOptions();

// A client of --server with ConnectionOptions().
absl::StatusOr<std::unique_ptr<client::Client>> Connect();

// Runs `body` with a connected client; a local setup problem exits 2.
template <typename Body>
int WithClient(Body body) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = Connect();
  if (!c.ok()) return InputError(c.status());
  return body(**c);
}

// The dtype `value` of the option --`flag`, one of `allowed`.
absl::StatusOr<DType> ParseDTypeFlag(absl::string_view flag, const std::string& value,
                                     std::initializer_list<DType> allowed);

// The cross-entropy's --reduction: mean, sum or none (any case).
absl::StatusOr<client::Reduction> ParseReduction(const std::string& value);

}  // namespace logitd::logitctl
