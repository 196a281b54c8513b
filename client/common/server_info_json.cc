#include "client/common/server_info_json.h"

namespace logitd::client {

nlohmann::ordered_json ServerInfoJson(const ServerInfo& i, bool with_request_memory) {
  nlohmann::ordered_json j;
  j["version"] = i.version;
  j["build_id"] = i.build_id;
  j["backend"] = i.backend;
  j["device_name"] = i.device_name;
  j["compute_capability"] = i.compute_capability;
  j["multiprocessor_count"] = i.multiprocessor_count;
  j["driver_version"] = i.driver_version;
  j["cuda_runtime_version"] = i.cuda_runtime_version;
  j["cublaslt_version"] = i.cublaslt_version;
  j["blas_version"] = i.blas_version;
  j["weight_budget_bytes"] = i.weight_budget_bytes;
  j["weight_bytes_in_use"] = i.weight_bytes_in_use;
  j["max_request_bytes"] = i.max_request_bytes;
  j["chunk_bytes"] = i.chunk_bytes;
  j["device_bytes_in_use"] = i.device_bytes_in_use;
  j["split_k"] = i.split_k;
  j["algo_choices"] = i.algo_choices;
  j["algo_cache_path"] = i.algo_cache_path;
  if (with_request_memory) {
    j["request_memory_bytes"] = i.request_memory_bytes;
    j["request_bytes_in_flight"] = i.request_bytes_in_flight;
    j["request_bytes_high_water"] = i.request_bytes_high_water;
    j["requests_in_flight"] = i.requests_in_flight;
    j["max_concurrent_requests"] = i.max_concurrent_requests;
  }
  j["max_receive_message_bytes"] = i.max_receive_message_bytes;
  j["max_request_chunk_bytes"] = i.max_request_chunk_bytes;
  j["max_send_message_bytes"] = i.max_send_message_bytes;
  j["request_digest_last"] = i.request_digest_last;
  return j;
}

}  // namespace logitd::client
