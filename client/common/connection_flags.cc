#include "client/common/connection_flags.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/status_macros.h"

namespace logitd::client {
namespace {

// The flag's value as text; empty when this binary defines no such flag.
std::string FlagValue(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag == nullptr ? std::string() : flag->CurrentValue();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<ClientOptions> ClientOptionsFromFlags() {
  ClientOptions options;
  if (const std::string t = FlagValue("timeout"); !t.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(t, &seconds) || !(seconds >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--timeout: expected seconds >= 0, got ", t));
    }
    options.timeout = seconds == 0 ? absl::InfiniteDuration() : absl::Seconds(seconds);
  }
  if (const std::string c = FlagValue("chunk_bytes"); !c.empty()) {
    std::uint64_t bytes = 0;
    if (!absl::SimpleAtoi(c, &bytes) || bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chunk_bytes: expected a number of bytes > 0, got ", c));
    }
    options.chunk_bytes = bytes;
  }
  if (const std::string d = FlagValue("digest_after_bytes"); !d.empty()) {
    std::uint64_t bytes = 0;
    if (!absl::SimpleAtoi(d, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--digest_after_bytes: expected a number of bytes (0: never), got ", d));
    }
    options.digest_after_bytes = bytes;
  }
  if (const std::string lb = FlagValue("lb"); !lb.empty()) {
    if (lb != "pick_first" && lb != "round_robin") {
      return absl::InvalidArgumentError(
          absl::StrCat("--lb: expected pick_first or round_robin, got '", lb, "'"));
    }
    options.lb_policy = lb;
  }
  // --token, else --token_file, else $LOGITD_TOKEN.
  const std::string token = FlagValue("token");
  const std::string token_file = FlagValue("token_file");
  if (!token.empty() && !token_file.empty()) {
    return absl::InvalidArgumentError("--token and --token_file: give one of them, not both");
  }
  if (!token.empty()) {
    options.auth_token = std::string(absl::StripAsciiWhitespace(token));
  } else if (!token_file.empty()) {
    LOGITD_ASSIGN_OR_RETURN(const std::string text, ReadFile(token_file, "--token_file"));
    options.auth_token = std::string(absl::StripAsciiWhitespace(text));
    if (options.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: '", token_file, "' is empty"));
    }
  } else if (const char* env = std::getenv("LOGITD_TOKEN"); env != nullptr) {
    options.auth_token = std::string(absl::StripAsciiWhitespace(env));
  }
  const std::string ca = FlagValue("ca");
  const std::string cert = FlagValue("cert");
  const std::string key = FlagValue("key");
  if (ca.empty() && (!cert.empty() || !key.empty())) {
    return absl::InvalidArgumentError("--cert and --key need --ca (TLS is enabled by --ca)");
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together: give both or neither");
  }
  if (!ca.empty()) {
    options.use_tls = true;
    LOGITD_ASSIGN_OR_RETURN(options.root_ca_pem, ReadFile(ca, "--ca"));
    if (!cert.empty()) {
      LOGITD_ASSIGN_OR_RETURN(options.client_cert_pem, ReadFile(cert, "--cert"));
      LOGITD_ASSIGN_OR_RETURN(options.client_key_pem, ReadFile(key, "--key"));
    }
  }
  return options;
}

}  // namespace logitd::client
