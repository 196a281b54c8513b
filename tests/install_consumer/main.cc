// Smoke test of the installed logitd package: the public headers compile and
// the client library links. Creating a client does not connect.
#include <iostream>
#include <memory>

#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

int main() {
  absl::StatusOr<std::unique_ptr<logitd::client::Client>> client =
      logitd::client::Client::Create("127.0.0.1:1");
  if (!client.ok()) {
    std::cerr << "Client::Create failed: " << client.status() << "\n";
    return 1;
  }
  logitd::Tensor t(logitd::DType::kBf16, {2, 3});
  t.data<logitd::Bf16Bits>()[0] = logitd::FloatToBf16(1.5f);
  std::cout << "logitd consumer: dtype " << logitd::DTypeName(t.dtype())
            << ", element 0 = " << t.At(0) << "\n";
  return 0;
}
