// Who may call logitd.v1.Logitd, and as which tenant. With --auth_tokens a
// call must carry "authorization: Bearer <token>" naming a token of the
// tokens file; its tenant scopes the weights the call sees. Without it every
// call is the single default tenant, and only loopback peers are served
// unless --insecure_allow_remote is given.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/service/state/registry.h"

namespace logitd::service {

// The parsed tokens file: token -> tenant (with its quota resolved).
struct TokenTable {
  std::map<std::string, Tenant, std::less<>> tenants_by_token;
  // Distinct tenants named by the file.
  std::size_t tenant_count = 0;
};

// Parses a tokens file's contents: one "TOKEN TENANT [QUOTA_BYTES]" per line,
// fields separated by spaces or tabs; blank lines and lines whose first
// non-blank character is '#' are skipped. A tenant without a third column
// gets `default_quota_bytes` (0 = only the server's budget). InvalidArgument
// naming `source` and the line for a malformed line, a duplicate token, two
// quotas for one tenant, or a file with no token at all.
absl::StatusOr<TokenTable> ParseTokenTable(absl::string_view contents, absl::string_view source,
                                           std::uint64_t default_quota_bytes);

// Reads and parses the file `path`.
absl::StatusOr<TokenTable> LoadTokenTable(const std::string& path,
                                          std::uint64_t default_quota_bytes);

// True for a peer on this machine: "ipv4:127.x.x.x:PORT", "ipv6:[::1]:PORT"
// (also percent-encoded, and IPv4-mapped 127.x), "unix:..." or "inproc".
bool IsLoopbackPeer(absl::string_view peer);

struct AuthOptions {
  // The --auth_tokens file; empty = no tokens, every caller is the default tenant.
  std::string tokens_path;
  // --tenant_quota_bytes: quota of tenants without a third column, and of the
  // default tenant; 0 = only the server's budget.
  std::uint64_t default_quota_bytes = 0;
  // --insecure_allow_remote: without tokens, serve non-loopback peers too.
  bool allow_remote = false;
};

// Thread-safe. Authenticate() runs at the start of every logitd.v1 call;
// Reload() swaps the token table (on SIGHUP) without disturbing calls.
class Authenticator {
 public:
  // Loads the tokens file when one is given; its error is the start-up error.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(AuthOptions options);

  bool tokens_enabled() const { return !options_.tokens_path.empty(); }
  const AuthOptions& options() const { return options_; }

  // The caller's tenant. Unauthenticated for a missing, malformed or unknown
  // bearer token (with tokens); PermissionDenied for a non-loopback peer
  // (without tokens and without allow_remote).
  absl::StatusOr<Tenant> Authenticate(const grpc::ServerContextBase& context) const;
  // The same from an "authorization" value (none: not sent) and a peer as
  // gRPC names one ("ipv4:127.0.0.1:PORT"): the history pages' check.
  absl::StatusOr<Tenant> AuthenticateBearer(std::optional<absl::string_view> authorization,
                                            absl::string_view peer) const;

  // Reads the tokens file again and, when it parses, replaces the table; on
  // an error the old table stays and the error is returned. Tenants whose
  // tokens are gone keep their weights (a token added back for them finds
  // them again). Returns a one-line summary on success.
  absl::StatusOr<std::string> Reload();

 private:
  explicit Authenticator(AuthOptions options) : options_(std::move(options)) {}

  const AuthOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::service
