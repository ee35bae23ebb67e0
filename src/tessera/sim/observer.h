// File: tessera/sim/observer.h
//
// Observer is the oracle side of a `tessera simulate` run: once a second, on its own thread, it
// lists the pods, nodes (and, with quota namespaces, the ResourceQuotas) from the API server,
// scrapes the scheduler's /metrics, and hands the truth and the exported view to the Oracle
// (with the MIG and quota observations the scenario calls for). Each observation becomes a
// Sample in the run book, with the last fault within the convergence window as the cause of a
// divergence. An observation that cannot list is skipped.
//
// Thread safety: AddViolation may be called from any thread; Start, Stop, Finish and Report
// from the run's thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/oracle.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

class Observer {
 public:
  struct Options {
    const Scenario* scenario = nullptr;
    kube::ApiClient* client = nullptr;   // the API server, a connection of its own
    kube::Transport* metrics = nullptr;  // the scheduler's metrics listener
    RunBook* book = nullptr;
    Clock* clock = nullptr;
    // apisim: a bound pod of the workload that someone else is deleting (an eviction) was seen;
    // called once per pod, with the run book's mutex held, after its stage became kDeleting.
    // Null: not watched (the real control plane's kubelet sees every deletion).
    std::function<void(const std::string& name)> on_evicted;
  };
  explicit Observer(Options options);
  ~Observer() { Stop(); }
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // Observes every second until Stop().
  void Start();
  void Stop();
  // A violation found outside the observations (a device plugin failing a pod).
  void AddViolation(absl::Time at, std::string what);
  // Ends the observations (the divergences still open are judged at `end`).
  void Finish(absl::Time end);
  // The oracle's findings and counts into `out`.
  void Report(RunResult* out);

 private:
  void Loop();
  void Observe();

  const Options options_;
  Mutex mutex_;
  Oracle oracle_ ABSL_GUARDED_BY(mutex_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::sim
