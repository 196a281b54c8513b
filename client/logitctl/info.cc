// logitctl info: what the server runs on and its limits, as rows or JSON.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/common/server_info_json.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "logitd/client.h"
#include "nlohmann/json.hpp"

namespace logitd::logitctl {

int CmdInfo(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("info takes no arguments");
  return WithClient([](client::Client& c) {
    absl::StatusOr<client::ServerInfo> info = c.Info();
    if (!info.ok()) return ServerError(info.status());
    const client::ServerInfo& i = *info;
    if (absl::GetFlag(FLAGS_json)) {
      nlohmann::ordered_json j;
      j["server"] = absl::GetFlag(FLAGS_server);
      j.update(client::ServerInfoJson(i, /*with_request_memory=*/true));
      std::cout << j.dump(2) << "\n";
      return kExitOk;
    }
    PrintRows({{"server", absl::GetFlag(FLAGS_server)},
               {"version", i.version},
               {"build_id", i.build_id},
               {"backend", i.backend},
               {"device_name", i.device_name},
               {"compute_capability", i.compute_capability},
               {"multiprocessor_count", absl::StrCat(i.multiprocessor_count)},
               {"driver_version", i.driver_version},
               {"cuda_runtime_version", i.cuda_runtime_version},
               {"cublaslt_version", i.cublaslt_version},
               {"blas_version", i.blas_version},
               {"weight_budget_bytes", Bytes(i.weight_budget_bytes)},
               {"weight_bytes_in_use", Bytes(i.weight_bytes_in_use)},
               {"max_request_bytes", Bytes(i.max_request_bytes)},
               {"chunk_bytes", Bytes(i.chunk_bytes)},
               {"device_bytes_in_use", Bytes(i.device_bytes_in_use)},
               {"split_k", i.split_k},
               {"algo_choices", i.algo_choices},
               {"algo_cache_path", i.algo_cache_path.empty() ? "-" : i.algo_cache_path},
               {"request_memory_bytes", Bytes(i.request_memory_bytes)},
               {"request_bytes_in_flight", Bytes(i.request_bytes_in_flight)},
               {"request_bytes_high_water", Bytes(i.request_bytes_high_water)},
               {"requests_in_flight", absl::StrCat(i.requests_in_flight)},
               {"max_concurrent_requests", absl::StrCat(i.max_concurrent_requests)},
               {"max_receive_message_bytes", Bytes(i.max_receive_message_bytes)},
               {"max_request_chunk_bytes", Bytes(i.max_request_chunk_bytes)},
               {"max_send_message_bytes", Bytes(i.max_send_message_bytes)},
               {"request_digest_last", i.request_digest_last ? "true" : "false"}});
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
