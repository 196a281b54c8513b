// The test faults on output bytes (--test_fault: logits_bit, dx_bit, ...),
// applied by a backend that sits in front of the real one, so that the
// handlers carry no test hooks: every output a call returns, streamed or
// written to shared memory, passes through here right after it is computed.
#pragma once

#include <memory>

#include "server/kernels/backend.h"
#include "server/service/faults/faults.h"

namespace logitd::service {

// `backend` itself when `faults` has none on; otherwise a backend that
// forwards every call to it and changes the outputs as the faults say.
std::unique_ptr<kernels::Backend> WithOutputFaults(std::unique_ptr<kernels::Backend> backend,
                                                   std::shared_ptr<FaultInjector> faults);

}  // namespace logitd::service
