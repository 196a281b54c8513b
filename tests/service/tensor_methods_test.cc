// logitd.v1's tensor methods served from the operations' table
// (call/operations.h, v1/tensor_methods.h): every row with a run is a
// tensor call of the proto whose header has every field the operation
// reads, each answers through the generic service with the service's own
// refusal (not UNIMPLEMENTED), and a method of no row is UNIMPLEMENTED with
// its name while the server keeps serving.
#include "server/service/v1/tensor_methods.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/v1/logitd.pb.h"
#include "server/service/call/operations.h"
#include "server/service/v1/requests.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// A header of `type` with every TensorSpec field given, each named as its
// field and with a digest, as a well-formed request has them.
std::unique_ptr<google::protobuf::Message> HeaderWithEveryTensor(
    const google::protobuf::Message& type) {
  std::unique_ptr<google::protobuf::Message> header(type.New());
  const google::protobuf::Descriptor* d = header->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated() || f->message_type() != v1::TensorSpec::descriptor()) continue;
    auto* spec = static_cast<v1::TensorSpec*>(header->GetReflection()->MutableMessage(header.get(), f));
    spec->set_name(f->name());
    spec->set_xxh3(1);
  }
  return header;
}

TEST(TensorMethodsTableTest, EveryOperationRowIsATensorCallWhoseHeaderHasEveryFieldItReads) {
  std::set<std::string> rows;
  for (const service::OperationInfo& op : service::Operations()) {
    if (op.run == nullptr) continue;
    rows.insert(std::string(op.method));
    SCOPED_TRACE(op.method);
    absl::StatusOr<service::AnyTypes> types = service::TensorCallTypes(op.method);
    ASSERT_TRUE(types.ok()) << types.status();
    ASSERT_NE(op.read, nullptr);
    const std::unique_ptr<google::protobuf::Message> header = HeaderWithEveryTensor(*types->header);
    service::V1RequestFields fields(*header, service::V1Shm{});
    EXPECT_TRUE(op.read(fields).ok()) << op.read(fields);
    EXPECT_FALSE(op.inputs.empty());
  }
  for (const char* method : {"Logits", "Backward", "Cast", "CrossEntropy", "LogProbs"}) {
    EXPECT_EQ(rows.count(method), 1u) << method << " registers no row";
  }
}

TEST(TensorMethodsTableTest, AMisnamedFieldIsInternalNamingIt) {
  v1::LogitsHeader header;
  service::V1RequestFields fields(header, service::V1Shm{});
  EXPECT_EQ(fields.Float("alpa"), 0.0f);
  EXPECT_EQ(fields.Bool("out_dtype"), false) << "an enum read as a bool";
  EXPECT_EQ(fields.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(fields.status().message()), HasSubstr("'alpa'"));
}

TEST(TensorMethodsTableTest, AMethodOfAnotherShapeIsNoTensorCall) {
  for (const char* method : {"FetchGradient", "GetServerInfo", "RegisterWeight", "NoSuchMethod"}) {
    EXPECT_EQ(service::TensorCallTypes(method).status().code(), absl::StatusCode::kInternal)
        << method;
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
  for (const service::OperationInfo& op : service::Operations()) {
    if (op.run != nullptr) methods.insert(std::string(op.method));
  }
  ASSERT_GE(methods.size(), 6u) << "Verify and the five operations at least";
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
