// logitd's flags (defined in flags.cc) and what they configure: the backend,
// the service, the listening addresses and the credentials. Every check
// fails with a message that names the flag; Main prints it and exits 2.
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/kernels/backend.h"
#include "server/service/state/options.h"

namespace logitd {

// Host and port of --address. A "unix:" address has no port.
struct ListenAddress {
  std::string host;
  bool unix_socket = false;
};

// What the flags configure, checked.
struct ServerConfig {
  // --address as given, and its host.
  std::string address;
  ListenAddress listen;
  // --port_file; empty: none.
  std::string port_file;
  // --metrics_address and --metrics_port_file; empty: none.
  std::string metrics_address;
  std::string metrics_port_file;
  // --backend as given, for the message when it cannot start.
  std::string backend_name;
  // `events` left empty: main.cc sets them.
  kernels::BackendOptions backend;
  service::ServiceOptions service;
  // Plaintext, TLS or mutual TLS; tls_mode says which ("off", "on" or
  // "mutual") and auth_mode who may call ("tokens", "none" or
  // "loopback-only"), for the start-up line.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string tls_mode;
  std::string auth_mode;
  // --oip: serve inference.GRPCInferenceService next to logitd.v1.
  bool oip = true;
};

// Sets the usage message and --version, checks the command line and parses
// it; --help and --version exit here. Abseil exits with status 1 on a
// malformed flag; logitd promises 2 for bad flags, so the command line is
// checked first, with the same rules, and the error returned instead.
absl::Status ParseFlags(int argc, char** argv);

// Applies --log_level, before anything else is logged.
absl::Status SetLogLevelFromFlag();

// Every other flag's value, checked in turn: the addresses, the backend, the
// service, authentication and TLS. Logs the warnings the configuration calls
// for (e.g. a non-loopback address without --auth_tokens).
absl::StatusOr<ServerConfig> ServerConfigFromFlags();

}  // namespace logitd
