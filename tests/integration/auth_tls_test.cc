// Bearer tokens, tenants, quotas, SIGHUP reload and TLS/mTLS against the real
// server. Certificates are made at test time with the openssl command-line
// tool: a CA, a server certificate for 127.0.0.1 and localhost, a client
// certificate, and a second, unrelated CA with a client certificate of its own.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  // Written under another name and renamed, as an operator's tooling would.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::filesystem::rename(tmp, path);
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool HaveOpenssl() { return std::system("openssl version >/dev/null 2>&1") == 0; }

// Makes the test PKI in `dir`: ca.pem, server.{pem,key}, client.{pem,key}
// (signed by ca), other-ca.pem and other-client.{pem,key} (signed by other-ca).
absl::Status MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(R"(set -e
cd )",
                                          Quote(dir), R"(
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
cat > ca.ext <<'EOF'
basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign
subjectKeyIdentifier=hash
EOF
cat > server.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EOF
cat > client.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
for ca in ca other-ca; do
  openssl req -new $ec -keyout $ca.key -out $ca.csr -subj "/CN=logitd test $ca"
  openssl x509 -req -in $ca.csr -signkey $ca.key -out $ca.pem -days 2 -extfile ca.ext
done
make() {  # name ca ext subject
  openssl req -new $ec -keyout $1.key -out $1.csr -subj "/CN=$4"
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem -days 2 \
    -extfile $3.ext
}
make server ca server localhost
make client ca client team-a-client
make other-client other-ca client intruder
)");
  const std::string cmd =
      absl::StrCat("bash -c ", Quote(script), " >", Quote(dir + "/openssl.log"), " 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("openssl failed to make the test certificates: ",
                                            ReadFile(dir + "/openssl.log")));
  }
  return absl::OkStatus();
}

client::ClientOptions WithToken(const std::string& token) {
  client::ClientOptions o;
  o.timeout = absl::Seconds(60);
  o.auth_token = token;
  return o;
}

std::unique_ptr<client::Client> Connect(const std::string& address, client::ClientOptions o) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(address, std::move(o));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Waits until `probe` returns true (up to 20 s).
template <typename Probe>
bool Eventually(Probe probe) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (probe()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

constexpr char kTokens[] =
    "# tokens of the test server\n"
    "\n"
    "tok-a team-a\n"
    "tok-b\tteam-b\n"
    "tok-small small 4096\n";

// --- tokens and tenants --------------------------------------------------------

class AuthTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    WriteFile(*dir_ / "tokens", kTokens);
    // team-a and team-b get the default quota: 1 MB.
    StartSharedServer({"--auth_tokens=" + (*dir_ / "tokens"), "--tenant_quota_bytes=1000000"},
                      WithToken("tok-a"));
  }
  static void TearDownTestSuite() {
    SharedServerTest::TearDownTestSuite();
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<client::Client> As(const std::string& token) {
    return Connect(server_->process.address(), WithToken(token));
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(AuthTest, MissingTokenIsUnauthenticatedOnEveryCall) {
  std::unique_ptr<client::Client> anon = As("");
  ASSERT_NE(anon, nullptr);
  absl::StatusOr<client::ServerInfo> info = anon->Info();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(info.status().message(), HasSubstr("authorization: Bearer TOKEN"));
  EXPECT_EQ(anon->ListWeights().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->RegisterWeight(IntBf16({8, 16}, 1), "w").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->CastToBf16(IntFp32({4}, 2)).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->ReleaseWeight("w-0000000000000000-8x16").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->LoadWeight("x.safetensors", "t").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, UnknownTokenIsUnauthenticated) {
  std::unique_ptr<client::Client> wrong = As("tok-a-but-wrong");
  ASSERT_NE(wrong, nullptr);
  absl::StatusOr<client::ServerInfo> info = wrong->Info();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(info.status().message(), HasSubstr("not known to this server"));
  EXPECT_EQ(wrong->Logits(IntBf16({2, 16}, 3), "w-0000000000000000-8x16").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A prefix of a valid token is no token either.
  EXPECT_EQ(As("tok-")->Info().status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, HealthNeedsNoToken) {
  int serving = -1;
  EXPECT_EQ(HealthCheck(server_->process.address(), "logitd.v1.Logitd", &serving),
            grpc::StatusCode::OK);
  EXPECT_EQ(serving, 1);
  EXPECT_EQ(HealthCheck(server_->process.address(), "", &serving), grpc::StatusCode::OK);
  EXPECT_EQ(serving, 1);
}

TEST_F(AuthTest, AnotherTenantsHandleIsNotFound) {
  std::unique_ptr<client::Client> a = As("tok-a");
  std::unique_ptr<client::Client> b = As("tok-b");
  const Tensor w = IntBf16({64, 32}, 11);
  const Tensor x = IntBf16({4, 32}, 12);
  const Tensor dy = IntFp32({4, 64}, 13);
  absl::StatusOr<client::WeightInfo> reg = a->RegisterWeight(w, "a's head");
  ASSERT_TRUE(reg.ok()) << reg.status();
  const std::string handle = reg->handle;
  client::BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  ASSERT_TRUE(a->Backward(dy, x, handle, accumulate).ok());

  absl::StatusOr<Tensor> y = b->Logits(x, handle);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(y.status().message(), HasSubstr("for tenant 'team-b'"));
  EXPECT_EQ(b->Backward(dy, x, handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Backward(dy, x, handle, accumulate).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->FetchGradient(handle, /*zero_after_fetch=*/true).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(b->ZeroGradient(handle).code(), absl::StatusCode::kNotFound);
  client::CrossEntropyOptions ce;
  ce.want_dw = true;
  Tensor targets(DType::kInt64, {4});
  for (int i = 0; i < 4; ++i) targets.data<std::int64_t>()[i] = i;
  EXPECT_EQ(b->CrossEntropy(x, targets, handle, ce).status().code(), absl::StatusCode::kNotFound);
  const Tensor candidate = IntFp32({4, 64}, 14);
  client::VerifyArgs verify;
  verify.operation = client::VerifyOperation::kLogits;
  verify.weight_handle = handle;
  verify.x = x;
  verify.candidates["y"] = candidate;  // a view: the tensor outlives the call
  absl::Status verified = b->Verify(verify).status();
  EXPECT_EQ(verified.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(verified.message(), HasSubstr("for tenant 'team-b'"));
  absl::StatusOr<client::VerifyResult> own = a->Verify(verify);
  EXPECT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(b->ReleaseWeight(handle, /*force=*/true).status().code(), absl::StatusCode::kNotFound);

  // Nothing b did touched a's weight or its accumulated gradient.
  absl::StatusOr<Tensor> mine = a->Logits(x, handle);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(Fp32EqualsExact(*mine, ExactNT(x, w), {4, 64}));
  absl::StatusOr<client::GradientResult> g = a->FetchGradient(handle, false);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 1u);
  EXPECT_TRUE(a->ReleaseWeight(handle, true).ok());
}

TEST_F(AuthTest, ListWeightsShowsOnlyTheCallersWeights) {
  std::unique_ptr<client::Client> a = As("tok-a");
  std::unique_ptr<client::Client> b = As("tok-b");
  const Tensor shared = IntBf16({16, 32}, 21);
  absl::StatusOr<client::WeightInfo> a1 = a->RegisterWeight(shared, "a1");
  absl::StatusOr<client::WeightInfo> b1 = b->RegisterWeight(IntBf16({16, 32}, 22), "b1");
  // The same bytes, registered by b: b's own copy, not a's.
  absl::StatusOr<client::WeightInfo> b2 = b->RegisterWeight(shared, "b2");
  ASSERT_TRUE(a1.ok() && b1.ok() && b2.ok());
  EXPECT_EQ(b2->handle, a1->handle);
  EXPECT_FALSE(b2->already_registered);
  EXPECT_EQ(b2->registrations, 1u);

  absl::StatusOr<std::vector<client::WeightInfo>> la = a->ListWeights();
  absl::StatusOr<std::vector<client::WeightInfo>> lb = b->ListWeights();
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_EQ(la->size(), 1u);
  EXPECT_EQ((*la)[0].handle, a1->handle);
  EXPECT_EQ((*la)[0].name, "a1");
  ASSERT_EQ(lb->size(), 2u);
  for (const client::WeightInfo& w : *lb) EXPECT_NE(w.name, "a1");

  // b releasing its copy leaves a's.
  ASSERT_TRUE(b->ReleaseWeight(b2->handle).ok());
  EXPECT_TRUE(a->Logits(IntBf16({1, 32}, 23), a1->handle).ok());
  EXPECT_TRUE(a->ReleaseWeight(a1->handle).ok());
  EXPECT_TRUE(b->ReleaseWeight(b1->handle).ok());
  EXPECT_TRUE(a->ListWeights()->empty());
  EXPECT_TRUE(b->ListWeights()->empty());
}

TEST_F(AuthTest, QuotaIsResourceExhaustedAndTheServerKeepsServing) {
  std::unique_ptr<client::Client> small = As("tok-small");  // 4096 bytes, from its line
  absl::StatusOr<client::WeightInfo> w1 = small->RegisterWeight(IntBf16({32, 32}, 31), "w1");
  absl::StatusOr<client::WeightInfo> w2 = small->RegisterWeight(IntBf16({32, 32}, 32), "w2");
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_TRUE(w2.ok()) << w2.status();  // 2 x 2048 bytes: exactly the quota
  absl::StatusOr<client::WeightInfo> w3 = small->RegisterWeight(IntBf16({32, 32}, 33), "w3");
  EXPECT_EQ(w3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(w3.status().message(), HasSubstr("tenant 'small' has a weight quota of 4096 bytes"));
  EXPECT_THAT(w3.status().message(), HasSubstr("--tenant_quota_bytes"));
  // A gradient buffer (32 x 32 x 4 bytes) counts too.
  client::BackwardOptions accumulate;
  accumulate.accumulate_dw = true;
  EXPECT_EQ(small->Backward(IntFp32({2, 32}, 34), IntBf16({2, 32}, 35), w1->handle, accumulate)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);

  // Other tenants are not held to small's quota; small still works and
  // recovers its room by releasing.
  std::unique_ptr<client::Client> b = As("tok-b");
  absl::StatusOr<client::WeightInfo> bw = b->RegisterWeight(IntBf16({32, 32}, 33), "b");
  EXPECT_TRUE(bw.ok()) << bw.status();
  EXPECT_TRUE(small->Info().ok());
  EXPECT_TRUE(small->Logits(IntBf16({2, 32}, 36), w2->handle).ok());
  ASSERT_TRUE(small->ReleaseWeight(w1->handle).ok());
  absl::StatusOr<client::WeightInfo> again = small->RegisterWeight(IntBf16({32, 32}, 33), "w3");
  EXPECT_TRUE(again.ok()) << again.status();

  // team-b has no third column: --tenant_quota_bytes (1,000,000) applies.
  absl::StatusOr<client::WeightInfo> big = b->RegisterWeight(IntBf16({1024, 512}, 37), "1 MiB");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("weight quota of 1000000 bytes"));

  for (const auto& [c, h] :
       {std::pair{small.get(), w2->handle}, {small.get(), again->handle}, {b.get(), bw->handle}}) {
    EXPECT_TRUE(c->ReleaseWeight(h, true).ok());
  }
}

// A tenant's ServerInfo shows its own weights and calls: one tenant cannot
// watch another's activity through it.
TEST_F(AuthTest, ServerInfoShowsOnlyTheCallersOwnActivity) {
  std::unique_ptr<client::Client> a = As("tok-a");
  std::unique_ptr<client::Client> b = As("tok-b");
  absl::StatusOr<client::ServerInfo> before = a->Info();
  ASSERT_TRUE(before.ok()) << before.status();

  const Tensor w = IntBf16({64, 32}, 71);
  absl::StatusOr<client::WeightInfo> bw = b->RegisterWeight(w, "b-only");
  ASSERT_TRUE(bw.ok()) << bw.status();
  ASSERT_TRUE(b->Logits(IntBf16({16, 32}, 72), bw->handle).ok());
  absl::StatusOr<client::ServerInfo> b_info = b->Info();
  ASSERT_TRUE(b_info.ok());
  EXPECT_EQ(b_info->weight_bytes_in_use, bw->bytes);
  EXPECT_GT(b_info->request_bytes_high_water, 0u);
  EXPECT_EQ(b_info->weight_budget_bytes, 1000000u);  // team-b's quota
  EXPECT_EQ(b_info->device_bytes_in_use, 0u);

  absl::StatusOr<client::ServerInfo> after = a->Info();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->weight_bytes_in_use, before->weight_bytes_in_use);
  EXPECT_EQ(after->request_bytes_high_water, before->request_bytes_high_water);
  EXPECT_EQ(after->request_bytes_in_flight, before->request_bytes_in_flight);
  EXPECT_EQ(after->requests_in_flight, before->requests_in_flight);
  EXPECT_EQ(after->device_bytes_in_use, before->device_bytes_in_use);
  EXPECT_EQ(after->weight_budget_bytes, before->weight_budget_bytes);
  EXPECT_TRUE(b->ReleaseWeight(bw->handle, true).ok());
}

TEST_F(AuthTest, CallsAreLoggedWithTheirTenant) {
  ASSERT_TRUE(As("tok-b")->ListWeights().ok());
  EXPECT_TRUE(Eventually([] {
    return absl::StrContains(server_->process.Log(), "rpc=ListWeights code=OK") &&
           absl::StrContains(server_->process.Log(), "tenant=team-b");
  })) << server_->process.Log();
  EXPECT_THAT(server_->process.Log(), ::testing::Not(HasSubstr("tok-b")));
}

TEST(AuthReloadTest, SighupAddsAndRemovesTokensAndKeepsTheOldTableOnAnError) {
  TempDir dir;
  const std::string tokens = dir / "tokens";
  WriteFile(tokens, kTokens);
  absl::StatusOr<std::unique_ptr<SharedServer>> s =
      SharedServer::Start({"--auth_tokens=" + tokens}, WithToken("tok-a"));
  ASSERT_TRUE(s.ok()) << s.status();
  SharedServer& server = **s;
  std::unique_ptr<client::Client> fresh = Connect(server.process.address(), WithToken("tok-new"));
  std::unique_ptr<client::Client> b = Connect(server.process.address(), WithToken("tok-b"));
  EXPECT_EQ(fresh->Info().status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(b->Info().ok());
  absl::StatusOr<client::WeightInfo> aw = server.client->RegisterWeight(IntBf16({8, 16}, 41), "a");
  ASSERT_TRUE(aw.ok()) << aw.status();

  // tok-new joins team-a; tok-b goes.
  WriteFile(tokens, "tok-a team-a\ntok-new team-a\ntok-small small 4096\n");
  ASSERT_EQ(kill(server.process.pid(), SIGHUP), 0);
  ASSERT_TRUE(Eventually([&] { return fresh->Info().ok(); })) << server.process.Log();
  EXPECT_EQ(b->Info().status().code(), absl::StatusCode::kUnauthenticated);
  // The new token acts for team-a and sees its weight.
  absl::StatusOr<std::vector<client::WeightInfo>> listed = fresh->ListWeights();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].handle, aw->handle);
  EXPECT_THAT(server.process.Log(), HasSubstr("reloaded 3 tokens for 2 tenants"));

  // A malformed file is refused and the tokens stay as they were.
  WriteFile(tokens, "tok-a team-a\nthis line has four fields\n");
  ASSERT_EQ(kill(server.process.pid(), SIGHUP), 0);
  ASSERT_TRUE(Eventually([&] {
    return absl::StrContains(server.process.Log(), "reload failed, keeping the tokens");
  })) << server.process.Log();
  EXPECT_THAT(server.process.Log(), HasSubstr("line:2: expected 'TOKEN TENANT [QUOTA_BYTES]'"));
  EXPECT_TRUE(fresh->Info().ok());
  EXPECT_EQ(b->Info().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(server.process.Running());
}

TEST(AuthStartTest, MalformedTokensFileStopsTheServerWithExit2) {
  TempDir dir;
  WriteFile(dir / "tokens", "tok-a team-a\ntok-a team-b\n");
  absl::StatusOr<ServerProcess> p =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--auth_tokens=" + (dir / "tokens")});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("(status 512)"));  // exit status 2
  EXPECT_THAT(p.status().message(), HasSubstr("line:2: this token is listed twice"));

  p = ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--auth_tokens=" + (dir / "none")});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("--auth_tokens: cannot read"));
}

// The first IPv4 address of this machine that is not loopback, if any.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

TEST(RemotePeerTest, WithoutTokensOnlyLoopbackIsServedUnlessAllowed) {
  const std::string ip = NonLoopbackAddress();
  if (ip.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to call from";
  // --address=0.0.0.0:0 overrides the helper's loopback address.
  absl::StatusOr<std::unique_ptr<SharedServer>> s =
      SharedServer::Start({"--address=0.0.0.0:0"}, WithToken(""));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string port = (*s)->process.address().substr((*s)->process.address().rfind(':') + 1);
  EXPECT_TRUE((*s)->client->Info().ok());  // over loopback
  std::unique_ptr<client::Client> remote = Connect(ip + ":" + port, WithToken(""));
  absl::StatusOr<client::ServerInfo> info = remote->Info();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(info.status().message(), HasSubstr("--auth_tokens"));
  EXPECT_THAT(info.status().message(), HasSubstr("--insecure_allow_remote"));
  EXPECT_EQ(remote->ListWeights().status().code(), absl::StatusCode::kPermissionDenied);
  int serving = -1;
  EXPECT_EQ(HealthCheck(ip + ":" + port, "", &serving), grpc::StatusCode::OK);  // probes stay open

  absl::StatusOr<std::unique_ptr<SharedServer>> open =
      SharedServer::Start({"--address=0.0.0.0:0", "--insecure_allow_remote"}, WithToken(""));
  ASSERT_TRUE(open.ok()) << open.status();
  const std::string open_port =
      (*open)->process.address().substr((*open)->process.address().rfind(':') + 1);
  EXPECT_TRUE(Connect(ip + ":" + open_port, WithToken(""))->Info().ok());
}

// --- TLS -----------------------------------------------------------------------

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveOpenssl()) return;
    dir_ = new TempDir();
    made_ = new absl::Status(MakeCertificates(dir_->path()));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    delete made_;
    made_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "the openssl command-line tool is not installed";
    ASSERT_TRUE(made_->ok()) << *made_;
  }
  static std::string Pem(const std::string& name) { return ReadFile(*dir_ / name); }
  static std::string Path(const std::string& name) { return *dir_ / name; }
  static client::ClientOptions Tls(const std::string& ca, const std::string& identity = "") {
    client::ClientOptions o;
    o.timeout = absl::Seconds(20);
    o.use_tls = true;
    o.root_ca_pem = Pem(ca + ".pem");
    if (!identity.empty()) {
      o.client_cert_pem = Pem(identity + ".pem");
      o.client_key_pem = Pem(identity + ".key");
    }
    return o;
  }
  static absl::StatusOr<std::unique_ptr<SharedServer>> StartTls(std::vector<std::string> extra,
                                                                client::ClientOptions o) {
    std::vector<std::string> args = {"--tls_cert=" + Path("server.pem"),
                                     "--tls_key=" + Path("server.key")};
    args.insert(args.end(), extra.begin(), extra.end());
    return SharedServer::Start(args, std::move(o));
  }

  static inline TempDir* dir_ = nullptr;
  static inline absl::Status* made_ = nullptr;
};

TEST_F(TlsTest, TlsWorksEndToEndAndPlaintextIsRefused) {
  absl::StatusOr<std::unique_ptr<SharedServer>> s = StartTls({}, Tls("ca"));
  ASSERT_TRUE(s.ok()) << s.status();
  client::Client& c = *(*s)->client;
  ASSERT_TRUE(c.Info().ok()) << c.Info().status();
  const Tensor w = IntBf16({64, 32}, 51);
  const Tensor x = IntBf16({3, 32}, 52);
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(w, "tls");
  ASSERT_TRUE(reg.ok()) << reg.status();
  absl::StatusOr<Tensor> y = c.Logits(x, reg->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {3, 64}));
  EXPECT_THAT((*s)->process.Log(), HasSubstr("tls=on"));

  // By name as well as by address (the certificate names both).
  const std::string port = (*s)->process.address().substr((*s)->process.address().rfind(':') + 1);
  EXPECT_TRUE(Connect("localhost:" + port, Tls("ca"))->Info().ok());

  client::ClientOptions plain;
  plain.timeout = absl::Seconds(10);
  EXPECT_EQ(Connect((*s)->process.address(), plain)->Info().status().code(),
            absl::StatusCode::kUnavailable);
  // A client that trusts another CA does not accept the server.
  EXPECT_EQ(Connect((*s)->process.address(), Tls("other-ca"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(c.Info().ok());
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutAValidCertificate) {
  absl::StatusOr<std::unique_ptr<SharedServer>> s =
      StartTls({"--tls_client_ca=" + Path("ca.pem")}, Tls("ca", "client"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->client->Info().ok()) << (*s)->client->Info().status();
  EXPECT_THAT((*s)->process.Log(), HasSubstr("tls=mutual"));

  EXPECT_EQ(Connect((*s)->process.address(), Tls("ca"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Connect((*s)->process.address(), Tls("ca", "other-client"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
  client::ClientOptions plain;
  plain.timeout = absl::Seconds(10);
  EXPECT_EQ(Connect((*s)->process.address(), plain)->Info().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*s)->client->Info().ok());
}

TEST_F(TlsTest, TokensOverMutualTls) {
  WriteFile(Path("tokens"), kTokens);
  client::ClientOptions o = Tls("ca", "client");
  o.auth_token = "tok-a";
  absl::StatusOr<std::unique_ptr<SharedServer>> s =
      StartTls({"--tls_client_ca=" + Path("ca.pem"), "--auth_tokens=" + Path("tokens")}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->client->ListWeights().ok());
  client::ClientOptions no_token = Tls("ca", "client");
  EXPECT_EQ(Connect((*s)->process.address(), no_token)->Info().status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsTest, BadTlsFlagsStopTheServerWithExit2) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--tls_cert=" + Path("server.pem")}, "--tls_cert and --tls_key go together"},
           {{"--tls_client_ca=" + Path("ca.pem")}, "--tls_client_ca needs --tls_cert"},
           {{"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("missing.key")},
            "--tls_key: cannot read"},
           {{"--tls_cert=" + Path("server.ext"), "--tls_key=" + Path("server.key")},
            "is not a PEM file"},
       }) {
    std::vector<std::string> args = {"--backend=cpu"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    absl::StatusOr<ServerProcess> p = ServerProcess::Start(ServerBinary(), args);
    ASSERT_FALSE(p.ok()) << c.says;
    EXPECT_THAT(p.status().message(), HasSubstr("(status 512)")) << c.says;
    EXPECT_THAT(p.status().message(), HasSubstr(c.says));
  }
}

// --- logitctl ------------------------------------------------------------------

// logitctl with $LOGITD_TOKEN set to `token`, or unset for nullopt; stdout
// and stderr together in `out`.
LogitctlRun RunWithToken(std::optional<std::string> token, const std::vector<std::string>& args) {
  LogitctlOptions options;
  options.env["LOGITD_TOKEN"] = std::move(token);
  options.merge_stderr = true;
  return RunLogitctl(args, options);
}

TEST_F(TlsTest, LogitctlTakesTokenCaCertAndKey) {
  WriteFile(Path("tokens"), kTokens);
  absl::StatusOr<std::unique_ptr<SharedServer>> s =
      StartTls({"--tls_client_ca=" + Path("ca.pem"), "--auth_tokens=" + Path("tokens")},
               Tls("ca", "client"));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string server = "--server=" + (*s)->process.address();
  const std::vector<std::string> tls = {"--ca=" + Path("ca.pem"), "--cert=" + Path("client.pem"),
                                        "--key=" + Path("client.key")};
  auto with = [&](std::vector<std::string> a) {
    std::vector<std::string> all = {server};
    all.insert(all.end(), tls.begin(), tls.end());
    all.insert(all.end(), a.begin(), a.end());
    return all;
  };
  LogitctlRun r = RunWithToken(std::nullopt, with({"--token=tok-a", "weights", "list"}));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = RunWithToken("tok-b", with({"info"}));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = RunWithToken(std::nullopt, with({"info"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;  // a server that refuses the client
  EXPECT_THAT(r.out, HasSubstr("UNAUTHENTICATED"));
  // --token wins over $LOGITD_TOKEN.
  r = RunWithToken("tok-b", with({"--token=nope", "info"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("UNAUTHENTICATED"));
  // Without the client certificate the server cannot be reached: exit 2.
  r = RunWithToken("tok-a", {server, "--ca=" + Path("ca.pem"), "info"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("UNAVAILABLE"));
}

// Every command reads the connection flags the same way, validate included:
// the same refusals, before any call.
TEST_F(TlsTest, EveryCommandRefusesTheSameConnectionFlags) {
  WriteFile(Path("empty_token"), "  \n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--token_file=" + Path("empty_token")}, "--token_file: '"},
      {{"--cert=" + Path("client.pem")}, "--cert and --key need --ca"},
      {{"--ca=" + Path("ca.pem"), "--cert=" + Path("client.pem")}, "--cert and --key go together"},
      {{"--token=a", "--token_file=" + Path("empty_token")}, "give one of them, not both"},
      {{"--timeout=-1"}, "--timeout: expected seconds >= 0"},
  };
  for (const auto& [flags, says] : cases) {
    for (const std::vector<std::string>& command :
         {std::vector<std::string>{"info"}, std::vector<std::string>{"validate", "--quick"}}) {
      std::vector<std::string> args = {"--server=127.0.0.1:1"};
      args.insert(args.end(), flags.begin(), flags.end());
      args.insert(args.end(), command.begin(), command.end());
      const LogitctlRun r = RunWithToken(std::nullopt, args);
      EXPECT_EQ(r.exit_code, 2) << command[0] << " " << says << ": " << r.out;
      EXPECT_THAT(r.out, HasSubstr(says)) << command[0];
    }
  }
}

}  // namespace
}  // namespace logitd::testing
