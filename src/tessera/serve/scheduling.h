// File: tessera/serve/scheduling.h
//
// Scheduling: the extender::Scheduler as serve wires it — node locks and pod lookups read from
// the informers, lock pauses that end at Stop, verdicts written by the leader only — behind the
// Backend's /filter, /bind and /refit, each counted in the metrics (tessera_filter_decisions_total
// and tessera_bind_total with their outcome labels), and the extender::Preemptor behind
// /preempt (404 with --preemption=off; with self, also an extender::SelfPreemptor told of
// every refusal). Until the informers have synced, /filter, /refit and /preempt answer with an
// error; only the leader refits (docs/serve.md "NUMA refit").
//
// Errors: in the replies, as extender::Scheduler gives them; Preempt's as a Status
// (Unavailable before the sync). Thread safety: every method from any thread.
#pragma once

#include <memory>
#include <string_view>

#include "tessera/accounting/node_registry.h"
#include "tessera/accounting/quota_book.h"
#include "tessera/base/clock.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/preempt.h"
#include "tessera/extender/scheduler.h"
#include "tessera/kube/client.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/housekeeping.h"
#include "tessera/serve/informers.h"
#include "tessera/serve/leadership.h"
#include "tessera/serve/service.h"

namespace tessera::serve {

// The verdict's VerdictInput::withheld: the registry has `node` in the ledger but it does not
// offer its devices (handshake expired, not Ready, not selected).
bool Withheld(const accounting::NodeRegistry& registry, std::string_view node);

class Scheduling {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    const device::Vendor* vendor = nullptr;
    ledger::Ledger* ledger = nullptr;
    const accounting::QuotaBook* quotas = nullptr;
    kube::ApiClient* client = nullptr;
    Informers* informers = nullptr;
    const accounting::NodeRegistry* registry = nullptr;
    const Leadership* leadership = nullptr;
    Inbox* inbox = nullptr;
    metrics::Registry* metrics = nullptr;
    Clock* clock = nullptr;
  };
  Scheduling(const ServeOptions& options, Parts parts);

  extender::FilterResult Filter(const extender::FilterArgs& args);
  extender::BindResult Bind(const extender::BindArgs& args);
  extender::RefitResponse Refit(const extender::RefitRequest& request);
  absl::StatusOr<extender::PreemptResult> Preempt(const extender::PreemptArgs& args);

  extender::Scheduler& scheduler() { return *scheduler_; }
  // With --preemption=self, what evicts for refused pods (its rounds: Preempting); else null.
  extender::SelfPreemptor* self_preemptor() { return self_preemptor_.get(); }

 private:
  const Parts parts_;
  const PreemptionMode mode_;
  std::unique_ptr<extender::Scheduler> scheduler_;
  std::unique_ptr<extender::Preemptor> preemptor_;
  std::unique_ptr<extender::SelfPreemptor> self_preemptor_;
};

}  // namespace tessera::serve
