// File: tessera/serve/leadership.h
//
// Leadership: the Elector that decides which replica runs the background writers, and what
// changes with the role — the handshake writes of the node registry (HandshakeWriter), HAMi's
// scheduler-role pod labels (RoleLabeler), tessera_leader, and at each gain the registry asking
// again for every write that is due. The rules: docs/serve.md "Leadership", leader.h,
// role_labels.h.
//
// Errors: Create returns the elector's (Elector::Create). Thread safety: IsLeader, Describe and
// DebugJson from any thread; Begin, Stop from the thread that runs Start/Stop; Tick and
// WriteHandshakes from the housekeeping loop only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include <nlohmann/json.hpp>

#include "tessera/accounting/node_registry.h"
#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/leader.h"
#include "tessera/serve/role_labels.h"

namespace tessera::serve {

class Leadership {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    kube::ApiClient* client = nullptr;
    // The role labels' check between passes: the pod informer holds every pod with its labels.
    const kube::Informer<kube::Pod>* pods = nullptr;
    accounting::NodeRegistry* registry = nullptr;
    metrics::Registry* metrics = nullptr;
    Clock* clock = nullptr;
  };
  // `labels.ns` empty: `default_namespace` (the client configuration's). Logs whether and how
  // the role labels are written.
  static absl::StatusOr<std::unique_ptr<Leadership>> Create(ElectorOptions elector,
                                                            RoleLabelOptions labels,
                                                            std::string_view default_namespace,
                                                            Parts parts);

  bool IsLeader() const { return elector_->IsLeader(); }
  std::string Describe() const { return elector_->Describe(); }
  // The "leadership" object of /debug/ledger.
  nlohmann::json DebugJson() const;

  // The elector's first round (the role before the first informer delivery), logged; then its
  // thread.
  void Begin();
  // Follows the role at `now`: tessera_leader, the registry's asks at a gain, the role labels.
  // Returns whether this replica leads.
  bool Tick(absl::Time now);
  // The handshake writes, the leader's job; a follower leaves them to the leader.
  void WriteHandshakes(const std::vector<accounting::NodePatch>& patches, bool leader);
  // Releases an own Lease for a quick takeover; tessera_leader drops to 0.
  void Stop();

 private:
  Leadership(Parts parts, std::unique_ptr<Elector> elector);

  const Parts parts_;
  std::unique_ptr<Elector> elector_;
  std::unique_ptr<accounting::HandshakeWriter> writer_;
  std::unique_ptr<RoleLabeler> role_labels_;
  uint64_t generation_ = 0;  // Tick only
};

}  // namespace tessera::serve
