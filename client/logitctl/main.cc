// logitctl: the command-line client of a logitd server. Reads and writes
// safetensors files, streams them through logitd::client::Client, and hands
// `logitctl validate` to the validation harness.
//
// Exit codes: 0 success; 1 the server answered with an error status; 2 a usage
// or local input error, or the server could not be reached.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/logitctl/bench.h"
#include "client/logitctl/stress.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/protocol.h"
#include "logitd/safetensors.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"
#ifdef LOGITCTL_HAVE_VALIDATE
#include "client/validate/cli.h"
#endif

// Connection (every subcommand).
ABSL_FLAG(std::string, server, "127.0.0.1:50051", "logitd server address (a gRPC target)");
ABSL_FLAG(double, timeout, 600, "per-call deadline in seconds; 0 for none");
ABSL_FLAG(std::uint64_t, chunk_bytes, logitd::kDefaultChunkBytes,
          "chunk size for tensors sent to the server, bytes");
ABSL_FLAG(std::string, token, "",
          "bearer token sent with every call (default: $LOGITD_TOKEN); visible to other users "
          "in the process list, so prefer $LOGITD_TOKEN or --token_file on shared machines");
ABSL_FLAG(std::string, token_file, "", "file holding a bearer token sent with every call");
ABSL_FLAG(std::string, ca, "",
          "PEM file of the CA that signed the server's certificate; enables TLS");
ABSL_FLAG(std::string, cert, "", "PEM client certificate for mutual TLS (needs --ca and --key)");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert");
ABSL_FLAG(std::string, lb, "pick_first",
          "gRPC load-balancing policy: pick_first (one server) or round_robin (calls spread over "
          "every address of --server, e.g. dns:///HOST:PORT or ipv4:IP:PORT,IP:PORT); not used "
          "by validate, which stays on one server");

// Subcommand options.
ABSL_FLAG(bool, json, false, "info, bench: print JSON instead of a table");
ABSL_FLAG(std::string, tensor, "", "weights register/load: tensor to read from the file");
ABSL_FLAG(std::string, name, "", "weights register/load: weight name (default: the tensor's name)");
ABSL_FLAG(std::string, x, "", "activations X as FILE[:TENSOR], bf16 [M, K]");
ABSL_FLAG(std::string, dy, "", "backward: logit gradient dY as FILE[:TENSOR], fp32 or bf16 [M, V]");
ABSL_FLAG(std::string, weight, "", "weight handle from `weights register`");
ABSL_FLAG(std::string, out, "", "output safetensors file");
ABSL_FLAG(bool, force, false,
          "weights release: drop the weight even if other registrations of it remain");
ABSL_FLAG(std::string, out_dtype, "fp32",
          "logits, bench: fp32 (the accumulator) or bf16 (legacy); bench: also dY's dtype");
ABSL_FLAG(double, alpha, 1.0, "logits: scale applied to X.W^T (non-zero)");
ABSL_FLAG(bool, shm, false,
          "logits, bench: move X and Y through a shared-memory region instead of gRPC (same "
          "host and user as a server started with --allow_shm)");
ABSL_FLAG(std::string, dx_dtype, "bf16", "backward, cross-entropy: dX dtype, bf16 or fp32");
ABSL_FLAG(std::string, dw_dtype, "fp32", "backward: dW dtype, fp32 or bf16");
ABSL_FLAG(bool, no_dx, false, "backward: do not compute dX");
ABSL_FLAG(bool, no_dw, false, "backward: do not compute dW");
ABSL_FLAG(bool, accumulate, false,
          "backward, cross-entropy: add dW into the server-held fp32 buffer instead of returning "
          "it");
ABSL_FLAG(bool, zero, false, "grad fetch: zero the server-held buffer after reading it");
ABSL_FLAG(std::string, in, "", "cast: fp32 input as FILE[:TENSOR]");
ABSL_FLAG(std::string, targets, "",
          "cross-entropy: target ids as FILE[:TENSOR], int32 or int64 [M]");
ABSL_FLAG(std::string, reduction, "mean", "cross-entropy: mean, sum or none (per-token losses)");
ABSL_FLAG(std::int64_t, ignore_index, -100, "cross-entropy: targets equal to this are ignored");
ABSL_FLAG(double, z_loss, 0, "cross-entropy: coefficient of the z-loss term z_loss * lse^2");
ABSL_FLAG(double, logit_softcap, 0, "cross-entropy: tanh soft-capping of the logits; 0 = off");
ABSL_FLAG(double, grad_scale, 1.0,
          "cross-entropy: incoming gradient of the reduced loss (non-zero)");
ABSL_FLAG(bool, lse, false, "cross-entropy: also return the log-sum-exp per token");
ABSL_FLAG(bool, dx, false, "cross-entropy: also return dX");
ABSL_FLAG(bool, dw, false,
          "cross-entropy: also compute dW (returned, or with --accumulate added "
          "into the server-held buffer)");

namespace logitd::logitctl {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    R"(logitctl: command-line client of a logitd server

usage: logitctl [common flags] COMMAND [args] [flags]

commands:
  info [--json]                      server backend, device, versions and limits
  weights register FILE --tensor=NAME [--name=NAME]
                                     upload a [V, K] weight (fp32 is rounded to bf16)
  weights load PATH --tensor=NAME [--name=NAME]
                                     the server reads a [V, K] weight from PATH, relative
                                     to its --weights_dir (fp32/fp16 rounded to bf16)
  weights list                       weights the server holds
  weights release HANDLE [--force]   release one registration; the weight and its
                                     gradient buffer go with the last
  logits --x=FILE[:TENSOR] --weight=HANDLE --out=FILE [--out_dtype=fp32|bf16] [--alpha=1]
         [--shm]
                                     Y = alpha * X.W^T, written as tensor "logits";
                                     --shm: X and Y through shared memory (server
                                     --allow_shm, same host and user)
  backward --dy=FILE[:TENSOR] --x=FILE[:TENSOR] --weight=HANDLE --out=FILE
           [--dx_dtype=bf16|fp32] [--dw_dtype=fp32|bf16] [--no_dx] [--no_dw] [--accumulate]
                                     dX = bf16(dY).W and dW = bf16(dY)^T.X, tensors "dx", "dw"
  grad fetch HANDLE --out=FILE [--zero]
                                     the accumulated fp32 dW, written as tensor "dw"
  grad zero HANDLE                   zero the accumulated dW
  cast --in=FILE[:TENSOR] --out=FILE the server's fp32 -> bf16 cast (round to nearest even)
  cross-entropy --x=FILE[:TENSOR] --targets=FILE[:TENSOR] --weight=HANDLE --out=FILE
           [--reduction=mean|sum|none] [--ignore_index=-100] [--z_loss=0] [--logit_softcap=0]
           [--grad_scale=1] [--lse] [--dx] [--dw] [--dx_dtype=bf16|fp32] [--accumulate]
                                     fused loss of the logits X.W^T against int32/int64
                                     targets, without the [M, V] logits; tensors "loss"
                                     ([M] for none, else [1]), "lse", "dx", "dw"
  stress [--clients=16] [--duration=SECONDS (default 60)] [--stress_max_m=4096]
         [--stress_max_v=128256] [--stress_max_k=4096] [--stress_max_output_bytes=1073741824]
         [--stress_slow_call=120] [--seed=1234] [--json]
                                     correctness soak: every tensor RPC from --clients
                                     connections with random and odd shapes, every result
                                     checked (exact on integer inputs, else inside the fp32
                                     bound); reports calls, errors, wrong results, hung calls
                                     and device memory before/after; exit 1 on any of them
  bench [--rpc=logits|backward|cross-entropy|fetch-gradient|baseline]
        [--m=16 --k=4096 --v=32768] [--out_dtype=fp32|bf16] [--concurrency=1] [--channels=1]
        [--requests=N | --duration=SECONDS (default 10)] [--warmup=1] [--nobaseline]
        [--seed=1234] [--json] [--shm]
                                     load test: registers a random bf16 weight, runs the
                                     RPC from --concurrency threads and reports requests/s,
                                     latency p50/p90/p99/max, payload GB/s each way, errors
                                     by status code and the server's time split; then the
                                     same bytes over the Probe RPC (plain gRPC) and the
                                     efficiency ratio. backward takes --no_dx --no_dw
                                     --accumulate, cross-entropy --dx --dw --accumulate;
                                     fetch-gradient reads the fp32 dW [V, K] back;
                                     baseline alone moves the bytes of the logits call
  validate [args]                    the validation harness
  help                               this text

common flags:
  --server=HOST:PORT (default 127.0.0.1:50051)  --timeout=SECONDS (default 600, 0 = none)
  --chunk_bytes=N (default 4190208: 4 MiB less 4 KiB)
  --token=TOKEN | --token_file=FILE  bearer token (default: $LOGITD_TOKEN)
  --ca=PEM [--cert=PEM --key=PEM]    TLS (mutual with --cert and --key)
  --lb=pick_first|round_robin        load balancing over the addresses of --server

FILE[:TENSOR] names a tensor in a safetensors file; the tensor may be left out
when the file holds exactly one.

exit codes: 0 ok, 1 the server refused or failed the operation,
            2 usage or input error, or the server could not be reached
)";

// --- command line -----------------------------------------------------------

struct CommandLine {
  // Positional words: the subcommand and its arguments.
  std::vector<std::string> words;
  // For `validate`: every token after the word, verbatim, so that the harness
  // sees its own options whatever way it reads them.
  std::vector<std::string> validate_args;
  bool help = false;
};

bool IsConnectionFlag(absl::string_view name) {
  for (absl::string_view f :
       {"server", "timeout", "chunk_bytes", "token", "token_file", "ca", "cert", "key"}) {
    if (name == f) return true;
  }
  return false;
}

// Sets registered absl flags from argv. Unlike absl::ParseCommandLine it
// reports problems as a status, so that a usage error exits 2 (not 1, which
// logitctl keeps for server errors). After the `validate` word it applies
// only the connection flags and hands every word on, verbatim, to the harness.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine cl;
  bool in_validate = false;
  bool only_words = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (in_validate) cl.validate_args.push_back(arg);
    if (only_words || arg.size() < 2 || arg[0] != '-') {
      if (!in_validate) {
        cl.words.push_back(arg);
        in_validate = cl.words.size() == 1 && arg == "validate";
      }
      continue;
    }
    if (arg == "--") {
      only_words = true;
      continue;
    }
    absl::string_view body(arg);
    body.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view flag_name = body;
    absl::string_view value;
    bool has_value = false;
    if (const std::size_t eq = body.find('='); eq != absl::string_view::npos) {
      flag_name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (!in_validate && (flag_name == "help" || flag_name == "h" || flag_name == "helpfull")) {
      cl.help = true;
      continue;
    }
    // After `validate` only the connection flags are logitctl's: the harness
    // has options of its own (--json=FILE, --seed) that may share a name with
    // another subcommand's flag.
    if (in_validate && !IsConnectionFlag(flag_name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(flag_name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(flag_name, "no")) {
      flag = absl::FindCommandLineFlag(flag_name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag_name));
    }
    std::string text(value);
    if (flag->IsOfType<bool>()) {
      if (negated) {
        if (has_value) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", flag_name, " takes no value, got '", value, "'"));
        }
        text = "false";
      } else if (!has_value) {
        text = "true";
      }
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag_name, " needs a value"));
      }
      text = argv[++i];
      if (in_validate) cl.validate_args.push_back(text);
    }
    std::string error;
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag->Name(), ": ", error));
    }
  }
  return cl;
}

// --- output helpers ----------------------------------------------------------

int UsageError(absl::string_view message) {
  std::cerr << "logitctl: " << message << "\nrun 'logitctl help' for usage\n";
  return kExitUsage;
}

// Local problems (files, dtypes) are the caller's input, not the server's.
int InputError(const absl::Status& status) {
  std::cerr << "logitctl: " << status.message() << "\n";
  return kExitUsage;
}

// A status that came back from the server. Unavailable means it was never
// reached, which is an environment problem like a usage error.
int ServerError(const absl::Status& status) {
  std::cerr << "logitctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return status.code() == absl::StatusCode::kUnavailable ? kExitUsage : kExitFailed;
}

// Prints key/value rows with the values in one column.
void PrintRows(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  for (const auto& [k, v] : rows) {
    std::cout << k << std::string(width - k.size() + 2, ' ') << (v.empty() ? "-" : v) << "\n";
  }
}

// Prints a table with a header row, every column padded to its widest cell.
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

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "FILE[:TENSOR]": an existing FILE is taken whole (paths may contain ':');
// otherwise the part after the last ':' names the tensor.
std::pair<std::string, std::string> SplitTensorRef(const std::string& ref) {
  if (std::ifstream(ref).good()) return {ref, ""};
  const std::size_t colon = ref.rfind(':');
  if (colon == std::string::npos || colon == 0) return {ref, ""};
  return {ref.substr(0, colon), ref.substr(colon + 1)};
}

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

absl::StatusOr<NamedTensor> LoadTensor(const std::string& path, std::string name,
                                       absl::string_view flag) {
  if (name.empty()) {
    absl::StatusOr<std::vector<std::string>> names = ListSafetensors(path);
    if (!names.ok())
      return absl::Status(names.status().code(),
                          absl::StrCat(flag, ": ", names.status().message()));
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
  client::ClientOptions options;
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (!(timeout >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout: expected seconds >= 0, got ", timeout));
  }
  options.timeout = timeout == 0 ? absl::InfiniteDuration() : absl::Seconds(timeout);
  options.lb_policy = absl::GetFlag(FLAGS_lb);
  if (options.lb_policy != "pick_first" && options.lb_policy != "round_robin") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lb: expected pick_first or round_robin, got '", options.lb_policy, "'"));
  }
  const std::string token_flag = absl::GetFlag(FLAGS_token);
  if (!token_flag.empty() && !absl::GetFlag(FLAGS_token_file).empty()) {
    return absl::InvalidArgumentError("--token and --token_file: give one of them, not both");
  }
  if (!token_flag.empty()) {
    options.auth_token = std::string(absl::StripAsciiWhitespace(token_flag));
  } else if (const char* env = std::getenv("LOGITD_TOKEN");
             env != nullptr && absl::GetFlag(FLAGS_token_file).empty()) {
    options.auth_token = std::string(absl::StripAsciiWhitespace(env));
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadTextFile(path, "--token_file");
    if (!token.ok()) return token.status();
    options.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: '", path, "' is empty"));
    }
  }
  const std::string ca = absl::GetFlag(FLAGS_ca);
  const std::string cert = absl::GetFlag(FLAGS_cert);
  const std::string key = absl::GetFlag(FLAGS_key);
  if (ca.empty() && (!cert.empty() || !key.empty())) {
    return absl::InvalidArgumentError("--cert and --key need --ca (TLS is enabled by --ca)");
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together: give both or neither");
  }
  if (!ca.empty()) {
    options.use_tls = true;
    absl::StatusOr<std::string> pem = ReadTextFile(ca, "--ca");
    if (!pem.ok()) return pem.status();
    options.root_ca_pem = *std::move(pem);
    if (!cert.empty()) {
      absl::StatusOr<std::string> c = ReadTextFile(cert, "--cert");
      if (!c.ok()) return c.status();
      absl::StatusOr<std::string> k = ReadTextFile(key, "--key");
      if (!k.ok()) return k.status();
      options.client_cert_pem = *std::move(c);
      options.client_key_pem = *std::move(k);
    }
  }
  return options;
}

absl::StatusOr<std::unique_ptr<client::Client>> Connect() {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return options.status();
  return client::Client::Create(absl::GetFlag(FLAGS_server), *std::move(options));
}

// Runs `body` with a connected client; a local setup problem exits 2.
template <typename Body>
int WithClient(Body body) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = Connect();
  if (!c.ok()) return InputError(c.status());
  return body(**c);
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

// --- subcommands --------------------------------------------------------------

int CmdInfo(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("info takes no arguments");
  return WithClient([](client::Client& c) {
    absl::StatusOr<client::ServerInfo> info = c.Info();
    if (!info.ok()) return ServerError(info.status());
    const client::ServerInfo& i = *info;
    if (absl::GetFlag(FLAGS_json)) {
      nlohmann::ordered_json j;
      j["server"] = absl::GetFlag(FLAGS_server);
      j["version"] = i.version;
      j["build_id"] = i.build_id;
      j["backend"] = i.backend;
      j["device_name"] = i.device_name;
      j["compute_capability"] = i.compute_capability;
      j["multiprocessor_count"] = i.multiprocessor_count;
      j["driver_version"] = i.driver_version;
      j["cuda_runtime_version"] = i.cuda_runtime_version;
      j["cublaslt_version"] = i.cublaslt_version;
      j["blas_version"] = i.blas_version;
      j["weight_budget_bytes"] = i.weight_budget_bytes;
      j["weight_bytes_in_use"] = i.weight_bytes_in_use;
      j["max_request_bytes"] = i.max_request_bytes;
      j["chunk_bytes"] = i.chunk_bytes;
      j["device_bytes_in_use"] = i.device_bytes_in_use;
      j["split_k"] = i.split_k;
      j["request_memory_bytes"] = i.request_memory_bytes;
      j["request_bytes_in_flight"] = i.request_bytes_in_flight;
      j["request_bytes_high_water"] = i.request_bytes_high_water;
      j["requests_in_flight"] = i.requests_in_flight;
      j["max_concurrent_requests"] = i.max_concurrent_requests;
      j["max_receive_message_bytes"] = i.max_receive_message_bytes;
      j["max_request_chunk_bytes"] = i.max_request_chunk_bytes;
      j["max_send_message_bytes"] = i.max_send_message_bytes;
      std::cout << j.dump(2) << "\n";
      return kExitOk;
    }
    PrintRows({{"server", absl::GetFlag(FLAGS_server)},
               {"version", i.version},
               {"build_id", i.build_id},
               {"backend", i.backend},
               {"device_name", i.device_name},
               {"compute_capability", i.compute_capability},
               {"multiprocessor_count", absl::StrCat(i.multiprocessor_count)},
               {"driver_version", i.driver_version},
               {"cuda_runtime_version", i.cuda_runtime_version},
               {"cublaslt_version", i.cublaslt_version},
               {"blas_version", i.blas_version},
               {"weight_budget_bytes", Bytes(i.weight_budget_bytes)},
               {"weight_bytes_in_use", Bytes(i.weight_bytes_in_use)},
               {"max_request_bytes", Bytes(i.max_request_bytes)},
               {"chunk_bytes", Bytes(i.chunk_bytes)},
               {"device_bytes_in_use", Bytes(i.device_bytes_in_use)},
               {"split_k", i.split_k},
               {"request_memory_bytes", Bytes(i.request_memory_bytes)},
               {"request_bytes_in_flight", Bytes(i.request_bytes_in_flight)},
               {"request_bytes_high_water", Bytes(i.request_bytes_high_water)},
               {"requests_in_flight", absl::StrCat(i.requests_in_flight)},
               {"max_concurrent_requests", absl::StrCat(i.max_concurrent_requests)},
               {"max_receive_message_bytes", Bytes(i.max_receive_message_bytes)},
               {"max_request_chunk_bytes", Bytes(i.max_request_chunk_bytes)},
               {"max_send_message_bytes", Bytes(i.max_send_message_bytes)}});
    return kExitOk;
  });
}

int CmdWeightsRegister(const std::vector<std::string>& words) {
  if (words.size() != 3)
    return UsageError("usage: weights register FILE --tensor=NAME [--name=NAME]");
  absl::StatusOr<NamedTensor> loaded =
      LoadTensor(words[2], absl::GetFlag(FLAGS_tensor), "weight file");
  if (!loaded.ok()) return InputError(loaded.status());
  const std::string tensor_name = loaded->name;
  absl::StatusOr<Tensor> w = ToBf16(*std::move(loaded), "weight");
  if (!w.ok()) return InputError(w.status());
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) name = tensor_name;
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(*w, name);
    if (!info.ok()) return ServerError(info.status());
    PrintRows({{"handle", info->handle},
               {"name", info->name},
               {"shape", ShapeString(info->shape)},
               {"xxh3", Hex64(info->xxh3)},
               {"bytes", Bytes(info->bytes)},
               {"already_registered", info->already_registered ? "true" : "false"},
               {"registrations", absl::StrCat(info->registrations)}});
    return kExitOk;
  });
}

int CmdWeightsLoad(const std::vector<std::string>& words) {
  const std::string tensor = absl::GetFlag(FLAGS_tensor);
  if (words.size() != 3 || tensor.empty()) {
    return UsageError("usage: weights load PATH --tensor=NAME [--name=NAME]");
  }
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::WeightInfo> info =
        c.LoadWeight(words[2], tensor, absl::GetFlag(FLAGS_name));
    if (!info.ok()) return ServerError(info.status());
    PrintRows({{"handle", info->handle},
               {"name", info->name},
               {"shape", ShapeString(info->shape)},
               {"xxh3", Hex64(info->xxh3)},
               {"bytes", Bytes(info->bytes)},
               {"converted",
                info->converted_from.empty()
                    ? "no (bf16 in the file)"
                    : absl::StrCat(info->converted_from, " -> bf16 (round to nearest even)")},
               {"already_registered", info->already_registered ? "true" : "false"},
               {"registrations", absl::StrCat(info->registrations)}});
    return kExitOk;
  });
}

int CmdWeightsList(const std::vector<std::string>& words) {
  if (words.size() != 2) return UsageError("weights list takes no arguments");
  return WithClient([](client::Client& c) {
    absl::StatusOr<std::vector<client::WeightInfo>> list = c.ListWeights();
    if (!list.ok()) return ServerError(list.status());
    std::vector<std::vector<std::string>> rows = {
        {"HANDLE", "NAME", "SHAPE", "BYTES", "GRADIENT", "REGISTRATIONS", "XXH3"}};
    for (const client::WeightInfo& w : *list) {
      rows.push_back({w.handle, w.name.empty() ? "-" : w.name, ShapeString(w.shape),
                      absl::StrCat(w.bytes), w.has_gradient ? "yes" : "no",
                      absl::StrCat(w.registrations), Hex64(w.xxh3)});
    }
    PrintTable(rows);
    return kExitOk;
  });
}

int CmdWeightsRelease(const std::vector<std::string>& words) {
  if (words.size() != 3) return UsageError("usage: weights release HANDLE [--force]");
  return WithClient([&](client::Client& c) {
    absl::StatusOr<std::uint64_t> freed = c.ReleaseWeight(words[2], absl::GetFlag(FLAGS_force));
    if (!freed.ok()) return ServerError(freed.status());
    PrintRows({{"released", words[2]}, {"bytes_freed", Bytes(*freed)}});
    return kExitOk;
  });
}

// Logits with X and Y in one shared-memory region of this process: X is
// copied in, Y copied out into a tensor; the region is released and
// unlinked whatever happens.
absl::StatusOr<Tensor> LogitsViaShm(client::Client& c, const Tensor& x, const std::string& handle,
                                    const client::LogitsOptions& options, client::Timing* timing) {
  absl::StatusOr<std::vector<client::WeightInfo>> weights = c.ListWeights();
  if (!weights.ok()) return weights.status();
  std::int64_t v = 0;
  for (const client::WeightInfo& w : *weights) {
    if (w.handle == handle && w.shape.size() == 2) v = w.shape[0];
  }
  if (v == 0) {
    return absl::NotFoundError(absl::StrCat("weight handle '", handle, "' is not registered"));
  }
  absl::StatusOr<std::int64_t> y_bytes = CheckedByteCount({x.dim(0), v}, options.out_dtype);
  if (!y_bytes.ok()) return y_bytes.status();
  const std::uint64_t y_offset = (x.nbytes() + 63) / 64 * 64;
  absl::StatusOr<client::SharedRegion> region =
      client::SharedRegion::Create(y_offset + static_cast<std::uint64_t>(*y_bytes));
  if (!region.ok()) return region.status();
  std::copy_n(x.bytes(), x.nbytes(), region->data());
  absl::StatusOr<std::string> region_handle = c.RegisterShm(*region);
  if (!region_handle.ok()) return region_handle.status();
  client::LogitsShmArgs args;
  args.x_slot = client::ShmSlot{*region_handle, &*region, 0};
  args.x_shape = x.shape();
  args.y_slot = client::ShmSlot{*region_handle, &*region, y_offset};
  absl::StatusOr<client::LogitsShmResult> r = c.LogitsShm(args, handle, options);
  const absl::Status released = c.ReleaseShm(*region_handle);
  if (!r.ok()) return r.status();
  if (!released.ok()) return released;
  Tensor y(r->y_dtype, r->y_shape);
  std::copy_n(region->data() + r->y_offset, y.nbytes(), y.bytes());
  if (y.Digest() != r->y_xxh3) {
    return absl::DataLossError("Y changed in shared memory after the server wrote it");
  }
  if (timing != nullptr) *timing = r->timing;
  return y;
}

int CmdLogits(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("logits takes flags only (--x, --weight, --out)");
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("logits: --weight=HANDLE is required");
  if (out.empty()) return UsageError("logits: --out=FILE is required");
  absl::StatusOr<DType> out_dtype =
      ParseDTypeFlag("out_dtype", absl::GetFlag(FLAGS_out_dtype), {DType::kFp32, DType::kBf16});
  if (!out_dtype.ok()) return UsageError(out_dtype.status().message());
  const double alpha = absl::GetFlag(FLAGS_alpha);
  if (alpha == 0 || !std::isfinite(alpha)) {
    return UsageError(absl::StrCat("--alpha: expected a finite non-zero scale, got ", alpha));
  }
  absl::StatusOr<NamedTensor> loaded = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded.ok()) return InputError(loaded.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded), "X");
  if (!x.ok()) return InputError(x.status());

  return WithClient([&](client::Client& c) {
    client::LogitsOptions options;
    options.out_dtype = *out_dtype;
    options.alpha = static_cast<float>(alpha);
    client::Timing timing;
    absl::StatusOr<Tensor> y = absl::GetFlag(FLAGS_shm)
                                   ? LogitsViaShm(c, *x, handle, options, &timing)
                                   : c.Logits(*x, handle, options, &timing);
    if (!y.ok()) return ServerError(y.status());
    if (absl::Status s = WriteOutput(out, {{"logits", &*y}},
                                     {{"weight_handle", handle},
                                      {"alpha", absl::StrCat(options.alpha)},
                                      {"producer", "logitctl logits"}});
        !s.ok()) {
      return InputError(s);
    }
    std::vector<std::pair<std::string, std::string>> rows = {
        {"out", absl::StrCat(out, " (tensor \"logits\")")},
        {"shape", ShapeString(y->shape())},
        {"dtype", std::string(DTypeName(y->dtype()))}};
    AppendTiming(timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

int CmdBackward(const std::vector<std::string>& words) {
  if (words.size() != 1)
    return UsageError("backward takes flags only (--dy, --x, --weight, --out)");
  client::BackwardOptions options;
  options.want_dx = !absl::GetFlag(FLAGS_no_dx);
  options.want_dw = !absl::GetFlag(FLAGS_no_dw);
  options.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
  absl::StatusOr<DType> dx_dtype =
      ParseDTypeFlag("dx_dtype", absl::GetFlag(FLAGS_dx_dtype), {DType::kBf16, DType::kFp32});
  if (!dx_dtype.ok()) return UsageError(dx_dtype.status().message());
  absl::StatusOr<DType> dw_dtype =
      ParseDTypeFlag("dw_dtype", absl::GetFlag(FLAGS_dw_dtype), {DType::kFp32, DType::kBf16});
  if (!dw_dtype.ok()) return UsageError(dw_dtype.status().message());
  options.dx_dtype = *dx_dtype;
  options.dw_dtype = *dw_dtype;
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("backward: --weight=HANDLE is required");
  // With --accumulate and --no_dx nothing comes back, so no file is needed.
  const bool returns_tensors = options.want_dx || (options.want_dw && !options.accumulate_dw);
  if (out.empty() && returns_tensors) return UsageError("backward: --out=FILE is required");

  absl::StatusOr<NamedTensor> dy = LoadTensorRef(absl::GetFlag(FLAGS_dy), "--dy");
  if (!dy.ok()) return InputError(dy.status());
  absl::StatusOr<NamedTensor> loaded_x = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded_x.ok()) return InputError(loaded_x.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded_x), "X");
  if (!x.ok()) return InputError(x.status());

  return WithClient([&](client::Client& c) {
    // dY travels as it is: rounding it to bf16 is the server's documented step.
    absl::StatusOr<client::BackwardResult> r = c.Backward(dy->tensor, *x, handle, options);
    if (!r.ok()) return ServerError(r.status());
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    std::vector<std::pair<std::string, std::string>> rows;
    if (r->dx) {
      tensors.emplace_back("dx", &*r->dx);
      rows.emplace_back("dx",
                        absl::StrCat(DTypeName(r->dx->dtype()), " ", ShapeString(r->dx->shape())));
    }
    if (r->dw) {
      tensors.emplace_back("dw", &*r->dw);
      rows.emplace_back("dw",
                        absl::StrCat(DTypeName(r->dw->dtype()), " ", ShapeString(r->dw->shape())));
    } else if (options.accumulate_dw && options.want_dw) {
      rows.emplace_back("dw", "accumulated on the server (grad fetch to read it)");
    }
    if (!tensors.empty()) {
      if (out.empty()) return UsageError("backward: --out=FILE is required");
      if (absl::Status s = WriteOutput(
              out, tensors, {{"weight_handle", handle}, {"producer", "logitctl backward"}});
          !s.ok()) {
        return InputError(s);
      }
      rows.insert(rows.begin(), {"out", out});
    }
    AppendTiming(r->timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

int CmdGrad(const std::vector<std::string>& words) {
  if (words.size() != 3 || (words[1] != "fetch" && words[1] != "zero")) {
    return UsageError("usage: grad fetch HANDLE --out=FILE [--zero] | grad zero HANDLE");
  }
  const std::string handle = words[2];
  if (words[1] == "zero") {
    return WithClient([&](client::Client& c) {
      if (absl::Status s = c.ZeroGradient(handle); !s.ok()) return ServerError(s);
      PrintRows({{"zeroed", handle}});
      return kExitOk;
    });
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("grad fetch: --out=FILE is required");
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::GradientResult> g = c.FetchGradient(handle, absl::GetFlag(FLAGS_zero));
    if (!g.ok()) return ServerError(g.status());
    if (absl::Status s = WriteOutput(out, {{"dw", &g->dw}},
                                     {{"weight_handle", handle},
                                      {"accumulated_calls", absl::StrCat(g->accumulated_calls)},
                                      {"producer", "logitctl grad fetch"}});
        !s.ok()) {
      return InputError(s);
    }
    PrintRows({{"out", absl::StrCat(out, " (tensor \"dw\")")},
               {"shape", ShapeString(g->dw.shape())},
               {"dtype", std::string(DTypeName(g->dw.dtype()))},
               {"accumulated_calls", absl::StrCat(g->accumulated_calls)},
               {"zeroed", absl::GetFlag(FLAGS_zero) ? "true" : "false"}});
    return kExitOk;
  });
}

int CmdCast(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("cast takes flags only (--in, --out)");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("cast: --out=FILE is required");
  absl::StatusOr<NamedTensor> in = LoadTensorRef(absl::GetFlag(FLAGS_in), "--in");
  if (!in.ok()) return InputError(in.status());
  return WithClient([&](client::Client& c) {
    absl::StatusOr<Tensor> y = c.CastToBf16(in->tensor);
    if (!y.ok()) return ServerError(y.status());
    // The output keeps the input's tensor name: the file is the bf16 twin.
    if (absl::Status s = WriteOutput(out, {{in->name, &*y}}, {{"producer", "logitctl cast"}});
        !s.ok()) {
      return InputError(s);
    }
    PrintRows({{"out", absl::StrCat(out, " (tensor \"", in->name, "\")")},
               {"shape", ShapeString(y->shape())},
               {"dtype", std::string(DTypeName(y->dtype()))}});
    return kExitOk;
  });
}

// A double flag as a finite float (a cast past FLT_MAX is undefined).
absl::StatusOr<float> FiniteFloatFlag(absl::string_view flag, double value) {
  if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected a finite fp32 value, got ", value));
  }
  return static_cast<float>(value);
}

absl::StatusOr<client::Reduction> ParseReduction(const std::string& value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "mean") return client::Reduction::kMean;
  if (v == "sum") return client::Reduction::kSum;
  if (v == "none") return client::Reduction::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--reduction: expected mean, sum or none, got '", value, "'"));
}

absl::string_view ReductionName(client::Reduction r) {
  switch (r) {
    case client::Reduction::kNone:
      return "none";
    case client::Reduction::kSum:
      return "sum";
    case client::Reduction::kMean:
      return "mean";
  }
  return "?";
}

int CmdCrossEntropy(const std::vector<std::string>& words) {
  if (words.size() != 1) {
    return UsageError("cross-entropy takes flags only (--x, --targets, --weight, --out)");
  }
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("cross-entropy: --weight=HANDLE is required");
  if (out.empty()) return UsageError("cross-entropy: --out=FILE is required");
  client::CrossEntropyOptions options;
  absl::StatusOr<client::Reduction> reduction = ParseReduction(absl::GetFlag(FLAGS_reduction));
  if (!reduction.ok()) return UsageError(reduction.status().message());
  options.reduction = *reduction;
  options.ignore_index = absl::GetFlag(FLAGS_ignore_index);
  absl::StatusOr<float> z_loss = FiniteFloatFlag("z_loss", absl::GetFlag(FLAGS_z_loss));
  if (!z_loss.ok()) return UsageError(z_loss.status().message());
  absl::StatusOr<float> softcap =
      FiniteFloatFlag("logit_softcap", absl::GetFlag(FLAGS_logit_softcap));
  if (!softcap.ok()) return UsageError(softcap.status().message());
  absl::StatusOr<float> grad_scale = FiniteFloatFlag("grad_scale", absl::GetFlag(FLAGS_grad_scale));
  if (!grad_scale.ok()) return UsageError(grad_scale.status().message());
  if (*grad_scale == 0.0f) {
    return UsageError(absl::StrCat("--grad_scale: expected a non-zero scale, got ",
                                   absl::GetFlag(FLAGS_grad_scale)));
  }
  options.z_loss = *z_loss;
  options.logit_softcap = *softcap;
  options.grad_scale = *grad_scale;
  options.want_lse = absl::GetFlag(FLAGS_lse);
  options.want_dx = absl::GetFlag(FLAGS_dx);
  options.want_dw = absl::GetFlag(FLAGS_dw);
  options.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
  if (options.accumulate_dw && !options.want_dw) {
    return UsageError("cross-entropy: --accumulate adds dW into the server-held buffer; add --dw");
  }
  absl::StatusOr<DType> dx_dtype =
      ParseDTypeFlag("dx_dtype", absl::GetFlag(FLAGS_dx_dtype), {DType::kBf16, DType::kFp32});
  if (!dx_dtype.ok()) return UsageError(dx_dtype.status().message());
  options.dx_dtype = *dx_dtype;

  absl::StatusOr<NamedTensor> loaded_x = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded_x.ok()) return InputError(loaded_x.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded_x), "X");
  if (!x.ok()) return InputError(x.status());
  absl::StatusOr<NamedTensor> targets = LoadTensorRef(absl::GetFlag(FLAGS_targets), "--targets");
  if (!targets.ok()) return InputError(targets.status());
  if (targets->tensor.dtype() != DType::kInt32 && targets->tensor.dtype() != DType::kInt64) {
    return InputError(absl::InvalidArgumentError(
        absl::StrCat("--targets '", targets->name, "': expected int32 or int64 token ids, got ",
                     DTypeName(targets->tensor.dtype()))));
  }

  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::CrossEntropyResult> r =
        c.CrossEntropy(*x, targets->tensor, handle, options);
    if (!r.ok()) return ServerError(r.status());
    std::vector<std::pair<std::string, const Tensor*>> tensors = {{"loss", &r->loss}};
    if (r->lse) tensors.emplace_back("lse", &*r->lse);
    if (r->dx) tensors.emplace_back("dx", &*r->dx);
    if (r->dw) tensors.emplace_back("dw", &*r->dw);
    if (absl::Status s = WriteOutput(out, tensors,
                                     {{"weight_handle", handle},
                                      {"reduction", std::string(ReductionName(options.reduction))},
                                      {"ignore_index", absl::StrCat(options.ignore_index)},
                                      {"z_loss", absl::StrCat(options.z_loss)},
                                      {"logit_softcap", absl::StrCat(options.logit_softcap)},
                                      {"grad_scale", absl::StrCat(options.grad_scale)},
                                      {"counted_tokens", absl::StrCat(r->counted_tokens)},
                                      {"producer", "logitctl cross-entropy"}});
        !s.ok()) {
      return InputError(s);
    }
    std::vector<std::pair<std::string, std::string>> rows = {{"out", out}};
    if (r->loss.numel() == 1 && r->loss.dtype() == DType::kFp32) {
      rows.emplace_back("loss", absl::StrFormat("%.9g", r->loss.data<float>()[0]));
    } else {
      rows.emplace_back(
          "loss", absl::StrCat(DTypeName(r->loss.dtype()), " ", ShapeString(r->loss.shape())));
    }
    rows.emplace_back("reduction", std::string(ReductionName(options.reduction)));
    rows.emplace_back("counted_tokens", absl::StrCat(r->counted_tokens));
    if (r->lse) {
      rows.emplace_back(
          "lse", absl::StrCat(DTypeName(r->lse->dtype()), " ", ShapeString(r->lse->shape())));
    }
    if (r->dx) {
      rows.emplace_back("dx",
                        absl::StrCat(DTypeName(r->dx->dtype()), " ", ShapeString(r->dx->shape())));
    }
    if (r->dw) {
      rows.emplace_back("dw",
                        absl::StrCat(DTypeName(r->dw->dtype()), " ", ShapeString(r->dw->shape())));
    } else if (options.accumulate_dw && options.want_dw) {
      rows.emplace_back("dw", "accumulated on the server (grad fetch to read it)");
    }
    AppendTiming(r->timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

int CmdBench(const std::vector<std::string>& words) {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return InputError(options.status());
  return RunBench(words, *options, absl::GetFlag(FLAGS_server));
}

int CmdStress(const std::vector<std::string>& words) {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return InputError(options.status());
  return RunStress(words, *options, absl::GetFlag(FLAGS_server));
}

int CmdValidate(const std::vector<std::string>& args) {
#ifdef LOGITCTL_HAVE_VALIDATE
  return validate::RunValidateCommand(args);
#else
  std::cerr << "logitctl: validate: this logitctl was built without the validation harness "
               "(target logitd_validate)\n";
  return kExitUsage;
#endif
}

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return UsageError(cl.status().message());
  if (cl->help) {
    std::cout << kUsage;
    return kExitOk;
  }
  const std::vector<std::string>& w = cl->words;
  if (w.empty()) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string& cmd = w[0];
  if (cmd == "help") {
    std::cout << kUsage;
    return kExitOk;
  }
  if (cmd == "validate") return CmdValidate(cl->validate_args);
  if (cmd == "info") return CmdInfo(w);
  if (cmd == "weights") {
    const std::string sub = w.size() > 1 ? w[1] : "";
    if (sub == "register") return CmdWeightsRegister(w);
    if (sub == "load") return CmdWeightsLoad(w);
    if (sub == "list") return CmdWeightsList(w);
    if (sub == "release") return CmdWeightsRelease(w);
    return UsageError("usage: weights register|load|list|release ...");
  }
  if (cmd == "logits") return CmdLogits(w);
  if (cmd == "backward") return CmdBackward(w);
  if (cmd == "grad") return CmdGrad(w);
  if (cmd == "cast") return CmdCast(w);
  if (cmd == "cross-entropy") return CmdCrossEntropy(w);
  if (cmd == "bench") return CmdBench(w);
  if (cmd == "stress") return CmdStress(w);
  return UsageError(absl::StrCat("unknown command '", cmd, "'"));
}

}  // namespace
}  // namespace logitd::logitctl

int main(int argc, char** argv) { return logitd::logitctl::Main(argc, argv); }
