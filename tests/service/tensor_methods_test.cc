// logitd.v1's tensor methods served from one table (v1/tensor_methods.h):
// the table holds a row for every tensor operation of the operations table
// (call/operations.h), each row's method answers through the generic
// service with the service's own refusal (not UNIMPLEMENTED), and a method
// of no row is UNIMPLEMENTED with its name while the server keeps serving.
#include "server/service/v1/tensor_methods.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/service/call/operations.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// The tensor operations served otherwise: RegisterWeight (client
// streaming) and FetchGradient (server streaming) by generated raw
// methods, Verify by the service's own handler.
const std::set<std::string>& ServedOtherwise() {
  static const auto* const kMethods =
      new std::set<std::string>{"RegisterWeight", "FetchGradient", "Verify"};
  return *kMethods;
}

TEST(TensorMethodsTableTest, EveryTensorOperationHasItsRowAndEveryRowItsOperation) {
  for (const service::OperationInfo& op : service::Operations()) {
    const bool tensor_call = !op.inputs.empty() || !op.outputs.empty();
    if (!tensor_call || ServedOtherwise().count(std::string(op.method)) > 0) continue;
    EXPECT_NE(service::FindV1TensorMethod(op.method), nullptr)
        << op.method << " streams tensors but v1/tensor_methods.cc has no row for it";
  }
  for (const service::V1Method& m : service::V1TensorMethods()) {
    const service::OperationInfo* op = service::FindOperation(m.method);
    ASSERT_NE(op, nullptr) << m.method << " has a v1 row but no row in call/operations.cc";
    EXPECT_FALSE(op->inputs.empty()) << m.method;
  }
}

// One call of `method` through a generic stub: the request stream closed
// at once, so the service refuses it for its missing header.
grpc::Status CallWithNoHeader(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& method) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  // Finish's tag; a read was never asked for.
  do {
    cq.Next(&tag, &ok);
  } while (tag != reinterpret_cast<void*>(3));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST_F(ServiceTest, EveryRowAndVerifyAreServedThroughTheGenericService) {
  std::set<std::string> methods = {"Verify"};
  for (const service::V1Method& m : service::V1TensorMethods())
    methods.insert(std::string(m.method));
  for (const std::string& method : methods) {
    const grpc::Status s = CallWithNoHeader(server().channel(), "/logitd.v1.Logitd/" + method);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
  }
}

TEST_F(ServiceTest, AMethodOfNoRowIsUnimplementedWithItsName) {
  for (const std::string method : {"/logitd.v1.Logitd/Softmax", "/no.Such/Method"}) {
    const grpc::Status s = CallWithNoHeader(server().channel(), method);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    EXPECT_THAT(s.error_message(), HasSubstr(method));
  }
  EXPECT_TRUE(client().Info().ok());
}

}  // namespace
}  // namespace logitd::testing
