// What the service is configured with (the server's flags, gathered by
// server/flags.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

#include "logitd/protocol.h"
#include "server/history/history_store.h"
#include "server/service/faults/faults.h"
#include "server/service/state/admission.h"
#include "server/service/state/auth.h"
#include "server/service/state/metrics.h"
#include "server/service/state/shm.h"

namespace logitd::service {

struct ServiceOptions {
  // Bytes of weights and their fp32 gradient buffers the server holds at most.
  std::uint64_t weight_budget_bytes = 16ull << 30;
  // Bytes of request and response tensors one call may move, together.
  std::uint64_t max_request_bytes = (4ull << 30) + 1;
  // Size of the chunks responses are streamed in, bytes.
  std::size_t chunk_bytes = kDefaultChunkBytes;
  // The largest chunk of a request, the largest request message (a chunk
  // and its framing) and the largest message sent; reported in ServerInfo.
  std::size_t max_request_chunk_bytes = kGrpcDefaultMaxMessageBytes;
  std::size_t max_receive_message_bytes = kGrpcDefaultMaxMessageBytes + kChunkFramingBytes;
  std::size_t max_send_message_bytes = kGrpcDefaultMaxMessageBytes;
  // Directory LoadWeight reads safetensors files from; empty refuses LoadWeight.
  std::filesystem::path weights_dir;
  FaultSet faults;
  // Who may call and as which tenant; null = no tokens, loopback peers only,
  // every caller the default tenant.
  std::shared_ptr<Authenticator> auth;
  // Where each call is recorded (not owned; must outlive the service). Null:
  // no metrics.
  Metrics* metrics = nullptr;
  // Request memory budget and concurrency cap for tensor calls.
  AdmissionOptions admission;
  // Same-host shared memory (--allow_shm, --shm_max_region_bytes).
  ShmOptions shm;
  // Tensor calls running at once, each on its own thread; one more is
  // refused with RESOURCE_EXHAUSTED. Admission (above) is what normally
  // limits load; this bounds the threads when calls pile up anyway.
  int max_call_threads = 64;
  // Where Verify records the runs a caller asks it to (--history); null:
  // the server keeps no history.
  std::shared_ptr<history::HistoryStore> history;
  // The most runs the history keeps per tenant (--history_max_runs); 0: all.
  std::int64_t history_max_runs = 100000;
  // The most bytes of runs it keeps per tenant (--history_max_bytes); 0: no
  // limit.
  std::int64_t history_max_bytes = std::int64_t{1} << 30;
};

}  // namespace logitd::service
