// File: tessera/extender/requeue.h
//
// Requeuer: puts a pending pod Tessera refused back into kube-scheduler's queue as soon as
// capacity it would fit in frees where kube-scheduler cannot see it — a reservation expired, a
// repair, a registration, health or cordon change, a namespace quota raised (docs/requeue.md).
// Each round brings its view of the ledger's capacity and the namespace limits up to date
// (Advance: only the nodes changed since are read) and tries the refused pods against what gained,
// highest priority first, with the decision cycle and no reservation (PickRequeues: each pick's
// devices are counted before the next pod is tried), and patches each pick's tessera.io/requeue
// annotation: an update of the pod, which moves it out of kube-scheduler's unschedulable pods.
//
//   Requeuer requeuer(options, {.vendor = &v, .ledger = &l, .quotas = &q, .verdicts = &w,
//                               .pod = by_uid, .client = client, .clock = clock});
//   requeuer.Round();     // from one thread, every period while leading
//   requeuer.Observe();   // or this while not
//
// A refusal offered since the last round is also tried against that round's gains (the filter
// decided it on the ledger before). Writes are rate-limited (Options::qps, burst); gains whose
// pods did not all get a turn are kept for the next round. A pod requeued less than Options::hold
// ago keeps its pick counted and is not written again. Errors: a failed write is logged and
// counted; the pod is tried again at the next gain. Thread safety: Round from one thread at a time;
// counts() from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "tessera/accounting/quota_book.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/verdict_writer.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/quota.h"

namespace tessera::extender {

// The requeue's picture of capacity, kept between rounds: every registered node's snapshot and
// every namespace's usage and limits (each sorted by name), current to a ledger version.
struct CapacityView {
  uint64_t version = 0;
  size_t registered = 0;  // the ledger's count at `version`
  std::vector<std::pair<std::string, device::NodeSnapshot>> nodes;
  std::vector<std::pair<std::string, ledger::NamespaceUsage>> namespaces;
  std::vector<schedule::NamespaceQuota> limits;
};

// Where capacity rose between two views (sorted, unique).
struct Gains {
  std::vector<std::string> nodes;       // a device's usage fell, or the node appeared, changed
                                        // its registration or stopped being blocked
  std::vector<std::string> namespaces;  // usage fell, or a limit rose or went
  bool Empty() const { return nodes.empty() && namespaces.empty(); }
  void Merge(const Gains& other);
};

// Brings `view` up to `ledger` (only the nodes changed since view->version are read; all of
// them for a new view or when a node was forgotten) and to `limits` (QuotaBook::AllLimits), and
// returns where capacity rose since (a new view: every node).
Gains Advance(const ledger::Ledger& ledger, std::vector<schedule::NamespaceQuota> limits,
              CapacityView* view);

// A pod PickRequeues chose, and where it would go.
struct Requeue {
  std::shared_ptr<const kube::Pod> pod;
  std::string node;
  device::PodDevices devices;
};

// The pods among `pods` that fit now: on a gained node, or on any node when their namespace
// gained. Pods are tried by priority (highest first), then namespace/name; a pod whose request
// does not decode is skipped; each pick's devices are added to `view` (and to its namespace's
// usage) before the next pod is tried (a copy: `view` stays as it is). `held` are pods
// requeued earlier whose picks still count: added first, never picked again. Stops after
// `limit` picks; `tried_all` says whether every pod had its turn.
std::vector<Requeue> PickRequeues(const device::Vendor& vendor, const cycle::Config& config,
                                  const Gains& gains,
                                  std::vector<std::shared_ptr<const kube::Pod>> pods,
                                  const std::vector<Requeue>& held, size_t limit,
                                  const CapacityView& view, bool* tried_all);

class Requeuer {
 public:
  struct Options {
    double qps = 50;  // writes per second; <= 0 turns the requeuer off
    int burst = 100;
    absl::Duration hold = absl::Seconds(10);  // kube-scheduler's longest default backoff
    device::NodePolicy node_policy = device::NodePolicy::kBinpack;
    device::GpuPolicy gpu_policy = {};
  };
  struct Parts {
    const device::Vendor* vendor = nullptr;
    const ledger::Ledger* ledger = nullptr;
    const accounting::QuotaBook* quotas = nullptr;  // may be null: no namespace is limited
    const VerdictWriter* verdicts = nullptr;        // the refused pods
    // The pending pod with `uid` as the informer has it; null when it is gone or not pending.
    std::function<std::shared_ptr<const kube::Pod>(std::string_view uid)> pod;
    kube::ApiClient* client = nullptr;
    Clock* clock = nullptr;
  };
  struct Counts {
    uint64_t rounds_with_gains = 0;
    uint64_t requeued = 0;  // patches that landed
    uint64_t failed = 0;
  };

  Requeuer(Options options, Parts parts);

  // One round: compare, pick, write. The first round only takes the view.
  void Round();
  // Takes the view and forgets what is held and carried, writing nothing (a replica that does
  // not lead: when it starts to, gains are counted from its last view).
  void Observe();
  Counts counts() const;

 private:
  bool Write(const Requeue& r, absl::Time now);
  // Advances view_ to the ledger and the limits now.
  Gains Refresh();

  const Options options_;
  const Parts parts_;
  kube::RateLimiter limiter_;
  bool have_view_ = false;
  CapacityView view_;
  Gains carried_;              // gains not yet offered to every pod
  uint64_t quota_cursor_ = 0;  // QuotaBook::LoosenedSince's
  Gains last_gains_;           // the last round's, for refusals offered late
  uint64_t offers_seen_ = 0;   // the verdict writer's latest offer at the last round
  absl::flat_hash_map<std::string, std::pair<Requeue, absl::Time>> held_;  // uid → pick, when
  mutable Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::extender
