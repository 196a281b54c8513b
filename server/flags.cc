#include "server/flags.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/protocol.h"
#include "server/flags_help.h"
#include "server/history/sql.h"
#include "server/service/faults/faults.h"
#include "server/service/state/auth.h"
#include "server/service/state/build_info.h"
#include "server/service/state/logging.h"
#include "server/service/state/metrics.h"
#include "server/service/state/status.h"
#include "server/state_dir.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051",
          "HOST:PORT to listen on. PORT 0 picks a free port (see --port_file). The default "
          "binds to loopback only; use 0.0.0.0:PORT or [::]:PORT to serve other hosts.");
ABSL_FLAG(std::string, port_file, "",
          "When set, the bound port followed by a newline is written to this file once the "
          "server accepts calls (useful with --address=HOST:0).");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT to serve Prometheus metrics on (HTTP, GET /metrics), HOST an IP address; "
          "PORT 0 picks a free port (see --metrics_port_file). Empty: no metrics endpoint.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "When set, the port of the metrics endpoint followed by a newline is written to this "
          "file once it listens (useful with --metrics_address=HOST:0).");
ABSL_FLAG(std::string, backend, "auto",
          "auto|cuda|cpu. auto picks cuda when a device is visible, else cpu.");
ABSL_FLAG(int, device, 0, "CUDA device ordinal (cuda backend).");
ABSL_FLAG(std::string, split_k, "fp32",
          "Split-K policy of the cuda backend: off, fp32 (split-K only with fp32 "
          "partial sums) or any.");
ABSL_FLAG(int, cpu_threads, 0, "BLAS threads of the cpu backend; 0 = the library's default.");
ABSL_FLAG(std::uint64_t, weight_budget_bytes, std::uint64_t{16} << 30,
          "Bytes of registered weights (bf16) plus their fp32 gradient buffers the server "
          "holds at most. Default 16 GiB.");
ABSL_FLAG(std::uint64_t, max_request_bytes, (std::uint64_t{4} << 30) + 1,
          "Bytes of tensors one call may move, request and response together (e.g. x plus "
          "logits). Default 4 GiB + 1 byte.");
ABSL_FLAG(std::uint64_t, request_memory_bytes, 0,
          "Bytes the tensor calls in flight may hold together (received tensors, outputs, "
          "scratch); a call that does not fit waits for memory, up to its deadline or "
          "--admission_wait, then gets RESOURCE_EXHAUSTED. 0 (default) = three quarters of "
          "physical memory.");
ABSL_FLAG(std::uint32_t, max_concurrent_requests, 64,
          "Tensor calls (and weight uploads) running at once; further calls wait as for "
          "memory. 0 = no cap. Default 64.");
ABSL_FLAG(absl::Duration, admission_wait, absl::Seconds(30),
          "Longest a call waits for request memory or a request slot when its deadline is "
          "later (or it has none), e.g. 30s, 500ms. Default 30s.");
ABSL_FLAG(std::uint64_t, chunk_bytes, logitd::kDefaultChunkBytes,
          "Bytes per chunk of streamed responses, 65536 (64 KiB) to 67108864 (64 MiB). "
          "Default 4190208 (4 MiB less 4 KiB), so that every message fits the 4 MiB gRPC "
          "clients accept by default; more needs clients with a raised receive limit.");
ABSL_FLAG(std::uint64_t, ce_workspace_bytes, 0,
          "cuda: device bytes a CrossEntropy or LogProbs call may use for its chunk of fp32 "
          "logits. 0 lets the backend choose: with gradients, chunks that keep peak memory "
          "within 1.5x the gradients it returns (more means fewer passes over dW and a faster "
          "call); without (loss only, LogProbs), chunks of 32 MiB or 8192 vocabulary rows, "
          "which the H200 runs fastest.");
ABSL_FLAG(std::uint64_t, pinned_cache_bytes, std::uint64_t{8} << 30,
          "cuda: bytes of page-locked host memory kept between calls for the tensor calls' input "
          "and output buffers (allocating and freeing it per call costs milliseconds for large "
          "tensors, and freeing stalls the device); 0 frees each buffer after its call. Size it "
          "for the buffers of the calls that run at once: a Verify of 4096 x 128256 fp32 logits "
          "holds 4.9 GiB of them. Default 8 GiB. cpu: the same cap for "
          "host buffers of 8 MiB and more (ordinary memory, kept so that a repeated call does "
          "not fault a fresh buffer's pages in).");
ABSL_FLAG(std::string, weights_dir, "",
          "Directory LoadWeight reads safetensors files from (paths relative to it, confined "
          "to it); empty = LoadWeight is refused.");
ABSL_FLAG(bool, allow_shm, false,
          "Let same-host clients register POSIX shared-memory objects (RegisterShm, or the Open "
          "Inference Protocol's SystemSharedMemoryRegister) that tensor calls read inputs from "
          "and write outputs to; the objects must belong to the server's user. Off: every "
          "shared-memory request is FAILED_PRECONDITION.");
ABSL_FLAG(std::uint64_t, shm_max_region_bytes, std::uint64_t{16} << 30,
          "Largest shared-memory region RegisterShm or SystemSharedMemoryRegister (offset + "
          "byte_size) maps, bytes (with --allow_shm).");
ABSL_FLAG(bool, shm_in_place, false,
          "With --allow_shm: read a tensor call's inputs in shared memory where they lie "
          "instead of copying them out first; their digest is computed while the backend "
          "works and checked before the result goes out (DATA_LOSS when it does not match). "
          "The client must not write an input's bytes until the call has returned: a change "
          "after the digest has read them goes unnoticed.");
ABSL_FLAG(bool, oip, true,
          "Serve the Open Inference Protocol (KServe v2 inference.GRPCInferenceService, the "
          "protocol Triton clients speak) on the same port, over the same weights, tokens and "
          "limits. false: its calls are UNIMPLEMENTED.");
ABSL_FLAG(std::string, auth_tokens, "",
          "File of 'TOKEN TENANT [QUOTA_BYTES]' lines: every logitd.v1 call must then carry "
          "'authorization: Bearer TOKEN', and sees only its tenant's weights. Reloaded on SIGHUP. "
          "Empty: no tokens, one default tenant, loopback callers only (see "
          "--insecure_allow_remote).");
ABSL_FLAG(std::uint64_t, tenant_quota_bytes, 0,
          "Bytes of weights and gradient buffers one tenant may hold at most, unless its line "
          "in --auth_tokens gives its own; 0 = only --weight_budget_bytes applies.");
ABSL_FLAG(bool, insecure_allow_remote, false,
          "Without --auth_tokens, serve callers on other machines too (anyone who can reach the "
          "port can use and release every weight).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server; with --tls_key, the server speaks TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates for mutual TLS: clients must present a certificate signed by one "
          "of them. Needs --tls_cert and --tls_key.");
ABSL_FLAG(absl::Duration, device_timeout, absl::Seconds(60),
          "Device work of one call that has not finished after this long means a hung device: "
          "the server then stops serving and exits with status 75 for its supervisor to restart "
          "it (as after an error that poisons the device). 0 turns the watchdog off. Default 60s.");
ABSL_FLAG(std::string, algo_cache, "auto",
          "cuda: file the chosen cuBLASLt algorithms are kept in, so that a restarted server "
          "(and any other on this machine and platform) runs the same algorithms and gives the "
          "same bits. auto: the per-user state file, $STATE_DIRECTORY/algo_cache.json under "
          "systemd, else $XDG_STATE_HOME/logitd/algo_cache.json, else "
          "~/.local/state/logitd/algo_cache.json. none: chosen anew by timing in every "
          "process (a restart may give other bits). Entries are keyed by device, SM count, "
          "driver, CUDA and cuBLASLt versions, workspace and --split_k.");
ABSL_FLAG(std::string, history, "auto",
          "Where Verify records the runs its callers ask it to (VerifyHeader.record) and ListRuns "
          "reads them: an SQLite file (WAL mode) or a PostgreSQL server, its schema migrated at "
          "start. auto: history.sqlite3 in the per-user state directory, as --algo_cache's; "
          "none: no history (recording Verify calls and ListRuns get FAILED_PRECONDITION); a "
          "file path; or postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (libpq's URI, its "
          "parameters included), one store several logitd replicas share.");
ABSL_FLAG(std::int64_t, history_max_runs, 100000,
          "The most recorded runs the history keeps per tenant: recording one more prunes the "
          "tenant's oldest (with their candidates). 0 keeps every run.");
ABSL_FLAG(std::int64_t, history_max_bytes, 1ll << 30,
          "The most bytes of recorded runs the history keeps per tenant (each run's figures, "
          "labels, block digests and alerts, as the store counts them): recording past it "
          "prunes the tenant's oldest runs, never a promoted baseline nor the run just "
          "recorded. 0: no limit.");
ABSL_FLAG(std::string, log_level, "info", "error|warning|info|debug.");
ABSL_FLAG(std::string, test_fault, "",
          "Testing only, in builds with LOGITD_ENABLE_TEST_FAULTS=ON: comma-separated faults "
          "that make results deliberately wrong (logits_bit, fp32_as_bf16, nan_to_zero, dx_bit, "
          "dw_bit, cast_bit, flaky_bit, digest), or fault the device on request "
          "(device_faults).");

namespace logitd {
namespace {

using service::LogInfo;
using service::LogWarning;

constexpr std::uint64_t kMinChunkBytes = std::uint64_t{64} << 10;
constexpr std::uint64_t kMaxChunkBytes = std::uint64_t{64} << 20;

// The command line by absl::ParseCommandLine's rules (see ParseFlags).
absl::Status CheckCommandLine(int argc, char** argv) {
  // Abseil's own flags; those taking a value may take it from the next word.
  static const char* const kBuiltin[] = {"help",        "helpfull", "helpshort",
                                         "helppackage", "version",  "only_check_args"};
  static const char* const kBuiltinWithValue[] = {"helpon",  "helpmatch",  "flagfile",
                                                  "fromenv", "tryfromenv", "undefok"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "': logitd takes only --flags"));
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const std::size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(eq + 1)) : "";
    if (std::find(std::begin(kBuiltin), std::end(kBuiltin), name) != std::end(kBuiltin)) continue;
    if (std::find(std::begin(kBuiltinWithValue), std::end(kBuiltinWithValue), name) !=
        std::end(kBuiltinWithValue)) {
      if (!has_value) ++i;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      absl::CommandLineFlag* negated =
          absl::StartsWith(name, "no") ? absl::FindCommandLineFlag(name.substr(2)) : nullptr;
      if (negated != nullptr && negated->IsOfType<bool>() && !has_value) continue;
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (flag->IsOfType<bool>()) {
      bool b;
      std::string error;
      if (has_value && !absl::ParseFlag(value, &b, &error)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": expected true or false, got '", value, "'"));
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
      value = argv[++i];
    }
    std::string error;
    bool ok = true;
    absl::string_view expected;
    if (flag->IsOfType<int>()) {
      int v;
      ok = absl::ParseFlag(value, &v, &error);
      expected = "an integer";
    } else if (flag->IsOfType<std::uint64_t>()) {
      std::uint64_t v;
      ok = absl::ParseFlag(value, &v, &error);
      expected = "a non-negative integer number of bytes";
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected ", expected, ", got '", value, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ListenAddress> ParseAddress(absl::string_view address) {
  ListenAddress out;
  if (absl::StartsWith(address, "unix:")) {
    out.host = std::string(address);
    out.unix_socket = true;
    return out;
  }
  const std::size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--address: expected HOST:PORT with PORT in 0..65535 (e.g. 127.0.0.1:50051, "
                     "[::1]:0, unix:/path), got '",
                     address, "'"));
  }
  out.host = std::string(address.substr(0, colon));
  return out;
}

// A PEM file named by a TLS flag, read whole at start.
absl::StatusOr<std::string> ReadPemFlag(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", path, "' is not a PEM file (no '-----BEGIN' line)"));
  }
  return pem;
}

// Server credentials from the TLS flags: plaintext without --tls_cert, TLS
// with it, mutual TLS (client certificates required and verified) with
// --tls_client_ca. `mode` says which, for the log.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFlags(
    std::string* mode) {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both (TLS) or neither (plaintext)");
  }
  if (cert.empty()) {
    if (!client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS first)");
    }
    *mode = "off";
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  LOGITD_ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFlag("tls_cert", cert));
  LOGITD_ASSIGN_OR_RETURN(pair.private_key, ReadPemFlag("tls_key", key));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  *mode = "on";
  if (!client_ca.empty()) {
    LOGITD_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFlag("tls_client_ca", client_ca));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    *mode = "mutual";
  }
  return grpc::SslServerCredentials(ssl);
}

// The backend's options from its flags; `events` left empty.
absl::StatusOr<kernels::BackendOptions> BackendOptionsFromFlags() {
  kernels::BackendOptions backend_options;
  absl::StatusOr<kernels::BackendKind> kind =
      kernels::ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!kind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend: expected auto, cuda or cpu, got '",
                                                   absl::GetFlag(FLAGS_backend), "'"));
  }
  backend_options.kind = *kind;
  backend_options.device = absl::GetFlag(FLAGS_device);
  if (backend_options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected a device ordinal >= 0, got ", backend_options.device));
  }
  absl::StatusOr<kernels::SplitK> split_k = kernels::ParseSplitK(absl::GetFlag(FLAGS_split_k));
  if (!split_k.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", split_k.status().message()));
  }
  backend_options.split_k = *split_k;
  backend_options.ce_workspace_bytes = absl::GetFlag(FLAGS_ce_workspace_bytes);
  backend_options.pinned_cache_bytes = absl::GetFlag(FLAGS_pinned_cache_bytes);
  backend_options.device_timeout = absl::GetFlag(FLAGS_device_timeout);
  if (backend_options.device_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--device_timeout: expected a duration >= 0 (0 = off), e.g. 60s");
  }
  absl::StatusOr<std::string> algo_cache =
      AlgoCachePathFromFlag(absl::GetFlag(FLAGS_algo_cache), std::getenv);
  if (algo_cache.ok()) {
    backend_options.algo_cache = *std::move(algo_cache);
  } else if (algo_cache.status().code() == absl::StatusCode::kInvalidArgument) {
    return algo_cache.status();
  } else {
    LogWarning(absl::StrCat("--algo_cache=auto: ", algo_cache.status().message(),
                            "; GEMM algorithms are chosen anew in every process (pass "
                            "--algo_cache=FILE to keep them)"));
  }
  backend_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  if (backend_options.cpu_threads < 0 || backend_options.cpu_threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu_threads: expected 0 (library default) to 4096, got ", backend_options.cpu_threads));
  }
  return backend_options;
}

// --chunk_bytes and the message limits that follow from it.
absl::Status SetChunkSizesFromFlags(service::ServiceOptions* options) {
  const std::uint64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--chunk_bytes: expected ", kMinChunkBytes,
                                                   " (64 KiB) to ", kMaxChunkBytes,
                                                   " (64 MiB) bytes, got ", chunk_bytes));
  }
  options->chunk_bytes = static_cast<std::size_t>(chunk_bytes);
  // Clients may send chunks of 4 MiB (older clients' default) even when this
  // server streams smaller ones.
  options->max_request_chunk_bytes =
      std::max<std::size_t>(options->chunk_bytes, kGrpcDefaultMaxMessageBytes);
  options->max_receive_message_bytes = options->max_request_chunk_bytes + kChunkFramingBytes;
  options->max_send_message_bytes =
      std::max<std::size_t>(options->chunk_bytes + kChunkFramingBytes, kGrpcDefaultMaxMessageBytes);
  if (options->max_send_message_bytes > kGrpcDefaultMaxMessageBytes) {
    LogWarning(absl::StrCat(
        "--chunk_bytes=", options->chunk_bytes, ": response messages of up to ",
        options->max_send_message_bytes, " bytes are over the ", kGrpcDefaultMaxMessageBytes,
        " bytes gRPC clients accept by default; clients must raise their receive limit to at "
        "least that (ServerInfo.max_send_message_bytes), or this server must run with "
        "--chunk_bytes of at most ",
        kDefaultChunkBytes));
  }
  return absl::OkStatus();
}

// Request memory, request slots and the wait for them.
absl::StatusOr<service::AdmissionOptions> AdmissionOptionsFromFlags() {
  service::AdmissionOptions admission;
  admission.memory_bytes = absl::GetFlag(FLAGS_request_memory_bytes);
  if (admission.memory_bytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    admission.memory_bytes =
        pages > 0 && page_size > 0
            ? static_cast<std::uint64_t>(pages) / 4 * 3 * static_cast<std::uint64_t>(page_size)
            : std::uint64_t{16} << 30;
  }
  admission.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  admission.max_wait = absl::GetFlag(FLAGS_admission_wait);
  if (admission.max_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--admission_wait: expected a duration >= 0, e.g. 30s");
  }
  return admission;
}

// --weights_dir, resolved; empty when not given.
absl::StatusOr<std::filesystem::path> WeightsDirFromFlag() {
  const std::string weights_dir = absl::GetFlag(FLAGS_weights_dir);
  if (weights_dir.empty()) return std::filesystem::path();
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::canonical(weights_dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weights_dir: expected an existing directory, got '", weights_dir, "'",
                     ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  return dir;
}

// The service's options from its flags, but for `auth` (AuthenticatorFromFlags)
// and `metrics` (created once the backend runs).
absl::StatusOr<service::ServiceOptions> ServiceOptionsFromFlags() {
  service::ServiceOptions options;
  options.weight_budget_bytes = absl::GetFlag(FLAGS_weight_budget_bytes);
  options.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (options.max_request_bytes == 0) {
    return absl::InvalidArgumentError("--max_request_bytes: expected at least 1 byte, got 0");
  }
  LOGITD_RETURN_IF_ERROR(SetChunkSizesFromFlags(&options));
  LOGITD_ASSIGN_OR_RETURN(options.admission, AdmissionOptionsFromFlags());
  LOGITD_ASSIGN_OR_RETURN(options.faults, service::ParseFaults(absl::GetFlag(FLAGS_test_fault)));
  LOGITD_ASSIGN_OR_RETURN(options.weights_dir, WeightsDirFromFlag());
  // Each call runs on its own thread; bound them so that a burst of calls is
  // refused (RESOURCE_EXHAUSTED) rather than exhausting memory. Enough threads
  // for every admitted request plus calls whose client has gone but which are
  // still finishing; admission control, not the threads, is what refuses
  // excess load.
  const int max_threads =
      std::max({16, 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                2 * static_cast<int>(absl::GetFlag(FLAGS_max_concurrent_requests))});
  options.max_call_threads = max_threads;
  options.shm.allowed = absl::GetFlag(FLAGS_allow_shm);
  options.shm.max_region_bytes = absl::GetFlag(FLAGS_shm_max_region_bytes);
  options.shm.in_place = absl::GetFlag(FLAGS_shm_in_place);
  if (options.shm.max_region_bytes == 0) {
    return absl::InvalidArgumentError("--shm_max_region_bytes: expected at least 1 byte, got 0");
  }
  return options;
}

// The tokens file (read now) and the tenants' default quota.
absl::StatusOr<std::shared_ptr<service::Authenticator>> AuthenticatorFromFlags() {
  service::AuthOptions auth_options;
  auth_options.tokens_path = absl::GetFlag(FLAGS_auth_tokens);
  auth_options.default_quota_bytes = absl::GetFlag(FLAGS_tenant_quota_bytes);
  auth_options.allow_remote = absl::GetFlag(FLAGS_insecure_allow_remote);
  absl::StatusOr<std::unique_ptr<service::Authenticator>> auth =
      service::Authenticator::Create(auth_options);
  if (!auth.ok()) return auth.status();
  return std::shared_ptr<service::Authenticator>(std::move(*auth));
}

// Who may call, for the start-up line; warns when that is anyone or when
// other machines are refused.
std::string AuthMode(const ServerConfig& config) {
  const ListenAddress& listen = config.listen;
  std::string auth_mode = "loopback-only";
  if (config.service.auth->tokens_enabled()) {
    auth_mode = "tokens";
  } else if (absl::GetFlag(FLAGS_insecure_allow_remote)) {
    auth_mode = "none";
    LogWarning(
        "--insecure_allow_remote: no authentication; anyone who can reach the port can use and "
        "release every weight");
  } else if (!listen.unix_socket &&
             !service::IsLoopbackPeer(absl::StrCat(
                 absl::StrContains(listen.host, ':') ? "ipv6:" : "ipv4:", listen.host, ":0")) &&
             listen.host != "localhost") {
    LogWarning(absl::StrCat("listening on ", config.address,
                            " without --auth_tokens: calls from other machines are refused "
                            "(PERMISSION_DENIED); pass --auth_tokens=FILE to serve them, or "
                            "--insecure_allow_remote to serve them without authentication"));
  }
  return auth_mode;
}

}  // namespace

absl::Status ParseFlags(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves the language-model head's GEMMs (bf16 operands, fp32 accumulation, fp32 logits) "
      "over gRPC.\nUsage: logitd [--address=HOST:PORT] [--backend=auto|cuda|cpu] [flags]");
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] {
    return absl::StrCat("logitd ", service::Version(), " (", service::BuildId(), ")\n");
  };
  absl::SetFlagsUsageConfig(usage_config);
  LOGITD_RETURN_IF_ERROR(CheckCommandLine(argc, argv));
  // --help (and --helpshort) list logitd's own flags, grouped; Abseil's
  // would list only main.cc's, which has none.
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" || arg == "-helpshort") {
      std::cout << FlagsHelp();
      std::exit(0);
    }
  }
  absl::ParseCommandLine(argc, argv);
  return absl::OkStatus();
}

absl::Status SetLogLevelFromFlag() {
  absl::StatusOr<service::LogLevel> log_level =
      service::ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!log_level.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_level: ", log_level.status().message()));
  }
  service::SetLogLevel(*log_level);
  return absl::OkStatus();
}

// The history --history asks for: null for none; an explicit file that
// cannot be opened is an error, the state directory's (auto) a warning.
absl::StatusOr<std::shared_ptr<history::HistoryStore>> HistoryFromFlags() {
  const std::string flag = absl::GetFlag(FLAGS_history);
  absl::StatusOr<std::string> path = HistoryPathFromFlag(flag, std::getenv);
  const auto unavailable = [&](absl::string_view why) {
    LogWarning(absl::StrCat("--history=auto: ", why,
                            "; no history is kept (pass --history=FILE to keep one)"));
    return std::shared_ptr<history::HistoryStore>();
  };
  if (!path.ok()) {
    if (flag == "auto") return unavailable(path.status().message());
    return path.status();
  }
  if (path->empty()) return std::shared_ptr<history::HistoryStore>();
  const bool postgres = history::sql::IsPostgresUri(*path);
  if (!postgres) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(*path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  absl::StatusOr<std::unique_ptr<history::HistoryStore>> store = history::HistoryStore::Open(*path);
  if (!store.ok()) {
    if (flag == "auto") return unavailable(store.status().message());
    return absl::Status(
        store.status().code(),
        absl::StrCat("--history=", history::sql::RedactUri(flag), ": ", store.status().message()));
  }
  LogInfo(absl::StrCat("history: recording runs in ", postgres ? "PostgreSQL at " : "",
                       (*store)->location(), " (schema version ",
                       history::HistoryStore::kSchemaVersion, ")"));
  return std::shared_ptr<history::HistoryStore>(*std::move(store));
}

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig config;
  config.address = absl::GetFlag(FLAGS_address);
  LOGITD_ASSIGN_OR_RETURN(config.listen, ParseAddress(config.address));
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  if (!config.metrics_address.empty()) {
    LOGITD_RETURN_IF_ERROR(service::CheckMetricsAddress(config.metrics_address));
  }
  config.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  config.backend_name = absl::GetFlag(FLAGS_backend);
  LOGITD_ASSIGN_OR_RETURN(config.backend, BackendOptionsFromFlags());
  LOGITD_ASSIGN_OR_RETURN(config.service, ServiceOptionsFromFlags());
  config.backend.test_device_faults = config.service.faults.has(service::FaultSet::kDeviceFaults);
  LOGITD_ASSIGN_OR_RETURN(config.service.auth, AuthenticatorFromFlags());
  LOGITD_ASSIGN_OR_RETURN(config.service.history, HistoryFromFlags());
  config.service.history_max_runs = absl::GetFlag(FLAGS_history_max_runs);
  if (config.service.history_max_runs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--history_max_runs: expected 0 (keep every run) or more, got ",
                     config.service.history_max_runs));
  }
  config.service.history_max_bytes = absl::GetFlag(FLAGS_history_max_bytes);
  if (config.service.history_max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--history_max_bytes: expected 0 (no limit) or more, got ",
                     config.service.history_max_bytes));
  }
  LOGITD_ASSIGN_OR_RETURN(config.credentials, ServerCredentialsFromFlags(&config.tls_mode));
  config.auth_mode = AuthMode(config);
  config.oip = absl::GetFlag(FLAGS_oip);
  return config;
}

}  // namespace logitd
