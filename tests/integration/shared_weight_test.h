// A shared-server suite with one registered weight and a generated stub of
// the logitd.v1 service, for the tests that send what the client library
// would not, next to what it does.
#pragma once

#include <string>

#include "logitd/tensor.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {

// A suite deriving from it sets weight_ and handle_ in its SetUpTestSuite()
// (after StartSharedServer) and calls OpenStub(); TearDownTestSuite() frees
// the three and the server.
class SharedWeightTest : public SharedServerTest {
 protected:
  // Opens stub_ to the shared server.
  static void OpenStub() { stub_ = NewGeneratedStub<v1::Logitd>(server_->process.address()); }
  static void TearDownTestSuite() {
    delete stub_;
    delete handle_;
    delete weight_;
    stub_ = nullptr;
    handle_ = nullptr;
    weight_ = nullptr;
    SharedServerTest::TearDownTestSuite();
  }

  static inline Tensor* weight_ = nullptr;
  static inline std::string* handle_ = nullptr;
  static inline v1::Logitd::Stub* stub_ = nullptr;
};

}  // namespace logitd::testing
