// File: tessera/sim/fault_injector.h
//
// FaultInjector carries out a scenario's faults during a `tessera simulate` run and records each
// in the run book (with its detail, or as skipped with the reason when the control plane cannot
// inject it). On apisim the API faults go through apisim's /simulator/v1 API (dropped events,
// refused requests, severed watches, compaction) and the child processes (apisim restart, serve
// kill); on the real control plane they map onto real ones (kube-apiserver restarts, serve
// frozen with SIGSTOP while pods are deleted past a compaction; docs/simulate.md). Node deletion
// and silent device plugins act on the emulated nodes on both. A fault with a duration ends on
// the `later` queue. Repair() ends them all for the drain.
//
// Errors of a fault are logged (kWarning/kError), never returned: the run goes on.
//
// Thread safety: Inject and Repair may run on several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/child_processes.h"
#include "tessera/sim/control_plane.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"
#include "tessera/sim/task_queue.h"

namespace tessera::sim {

class FaultInjector {
 public:
  struct Options {
    const Scenario* scenario = nullptr;
    bool real = false;               // the real control plane
    kube::Transport* api = nullptr;  // the API server
    RunBook* book = nullptr;
    ChildProcesses* children = nullptr;         // apisim: its children
    RealControlPlane* control_plane = nullptr;  // real: the control plane
    TaskQueue* later = nullptr;                 // the ends of faults with a duration
    Clock* clock = nullptr;
    // The workload's part: `n` live pods deleted (at once, or with grace 0 when forced); `n`
    // live pods picked (only bound ones with bound_only); one pod deleted now; a random number
    // (the run's seeded generator).
    std::function<void(int n, bool force)> delete_random_live;
    std::function<std::vector<std::string>(int n, bool bound_only)> pick_live;
    std::function<void(const std::string& name, bool force)> delete_pod;
    std::function<uint64_t()> random;
  };
  explicit FaultInjector(Options options) : options_(std::move(options)) {}

  void Inject(const FaultSpec& f);
  // The drain: no event dropped or request refused any more, a killed scheduler started again,
  // every device plugin reporting.
  void Repair();

 private:
  // kReal: the scenario's fault on the real control plane, or recorded as skipped.
  void RealFault(const FaultSpec& f);
  // kReal: serve frozen (SIGSTOP), kube-apiserver killed and restarted (every watch cut),
  // `burst` live pods deleted, until the revision before the deletions is compacted and at least
  // `duration` passed; then serve thawed: its watches resume into 410 and relist.
  void RealWatchLoss(const FaultSpec& f, bool force);
  bool WaitApiserver(absl::Duration limit);
  // apisim's fault configuration set to the faults on now.
  void PushFaults();
  void RecordFault(std::string kind, std::string detail) {
    options_.book->RecordFault(Now(), std::move(kind), std::move(detail));
  }
  void DeleteRandomLive(int n, bool force = false) { options_.delete_random_live(n, force); }
  absl::Time Now() const { return options_.clock->Now(); }

  const Options options_;
  struct RequestFailure {
    int code;
    double probability;
    std::vector<std::string> verbs;
  };
  Mutex mutex_;
  // dropWatchEvents of pods: the event type ("" all) and the probability.
  std::optional<std::pair<std::string, double>> drop_ ABSL_GUARDED_BY(mutex_);
  std::optional<RequestFailure> fail_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tessera::sim
