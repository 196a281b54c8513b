// What every front door serves over: the backend (behind the test-only
// fault decorator), the options, authentication, the weight registry,
// admission, shared-memory regions and the runner every call goes through.
// Built once by main (or a test's server) and handed to each front door —
// logitd.v1 (v1/service.h) and the Open Inference Protocol
// (oip/oip_service.h) — which are peers: neither owns it, neither includes
// the other. It outlives them: main builds it first and destroys it last.
#pragma once

#include <memory>
#include <string>

#include "server/kernels/backend.h"
#include "server/service/faults/faults.h"
#include "server/service/state/admission.h"
#include "server/service/state/auth.h"
#include "server/service/state/options.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"
#include "server/service/transport/call_runner.h"

namespace logitd::service {

class SharedState {
 public:
  // Without options.auth: no tokens, loopback peers only.
  SharedState(std::unique_ptr<kernels::Backend> backend, ServiceOptions options);
  SharedState(const SharedState&) = delete;
  SharedState& operator=(const SharedState&) = delete;

  kernels::Backend& backend() { return *backend_; }
  const kernels::Backend& backend() const { return *backend_; }
  const ServiceOptions& options() const { return options_; }
  Authenticator& authenticator() const { return *auth_; }
  WeightRegistry& registry() { return registry_; }
  const WeightRegistry& registry() const { return registry_; }
  RequestAdmission& admission() { return admission_; }
  const RequestAdmission& admission() const { return admission_; }
  ShmRegistry& shm() { return shm_; }
  const ShmRegistry& shm() const { return shm_; }
  const CallRunner& runner() const { return runner_; }
  // The faults --test_fault asked for, shared with the backend's decorator
  // (fault_backend.h); the digest fault is applied by the tensor calls.
  const std::shared_ptr<FaultInjector>& faults() const { return faults_; }

 private:
  std::shared_ptr<FaultInjector> faults_;
  // Declared before registry_ so that registered weights (backend objects)
  // are destroyed before the backend that made them.
  std::unique_ptr<kernels::Backend> backend_;
  const ServiceOptions options_;
  std::shared_ptr<Authenticator> auth_;
  WeightRegistry registry_;
  RequestAdmission admission_;
  // Mapped regions; unmapped when the state goes (at shutdown).
  ShmRegistry shm_;
  CallRunner runner_;
};

// Page-locks a registered region for the device's copies where the backend
// can (until the mapping goes); says how that went, for the log line.
std::string PinShmRegion(kernels::Backend& backend, ShmMapping* mapping);

}  // namespace logitd::service
