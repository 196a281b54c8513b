// How a test learns what a server made of a request stream: the messages
// written (stopping once the server stops reading, as it does after
// refusing a header), the stream half-closed, the response read to its end,
// and the call's status.
#pragma once

#include <grpcpp/grpcpp.h>

#include <vector>

namespace logitd::testing {

template <typename Response, typename Stream, typename Request>
grpc::Status FinishAfterWriting(Stream& stream, const std::vector<Request>& messages) {
  for (const Request& m : messages) {
    if (!stream.Write(m)) break;
  }
  stream.WritesDone();
  Response response;
  while (stream.Read(&response)) {
  }
  return stream.Finish();
}

}  // namespace logitd::testing
