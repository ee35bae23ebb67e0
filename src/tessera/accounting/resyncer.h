// File: tessera/accounting/resyncer.h
//
// Resyncer: the resync layer of the self-healing accounting. Every --resync-period (±10 %) it
// LISTs pods and nodes from the API server itself (paged, resourceVersion "", paced) and hands
// each complete list to Informer::Reconcile, which repairs the informer's store, and through its
// handlers the ledger and the node registry, by synthetic deliveries (missing, gone, stale).
//
//   Resyncer resyncer(&client, &pods, &nodes, {.period = absl::Minutes(5)}, on_report);
//   resyncer.Start();   // its own thread; the first pass one (jittered) period after Start
//   resyncer.Stop();
//
// Errors: a failed LIST is reported in ResyncReport::error (the other resource may still be
// repaired); the next pass tries again. Cost and pacing: docs/self-healing.md "The resync".
//
// Thread safety: Start and Stop from one thread (Stop is idempotent and run by the destructor);
// RunOnce and last() from any thread (passes are serialised). on_report runs on the pass's thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"

namespace tessera::accounting {

struct ResyncOptions {
  // Zero: Start() starts nothing (RunOnce still works).
  absl::Duration period = absl::Minutes(5);
  // Each wait is period × (1 + u), u uniform in [-jitter, +jitter].
  double jitter = 0.1;
  int64_t page_size = 500;
  // Pacing: after each LIST page the pass waits `pace` times as long as that page took (its
  // request, transfer and decoding), capped at max_page_pause, so a pass uses at most about
  // 1 / (1 + pace) of one core and leaves the rest to filter and bind. 0: no pause.
  double pace = 3.0;
  absl::Duration max_page_pause = absl::Seconds(1);
  // Longest wait for an informer to run a Reconcile before the pass gives up on it.
  absl::Duration reconcile_timeout = absl::Minutes(1);
  // Every time the resyncer reads: the reports' timestamps and durations, the period, the pauses
  // and the wait for an informer.
  Clock* clock = Clock::Real();
  // The jitter's random seed (a fixed default for tests; serve seeds each replica anew).
  uint64_t seed = 0x7e55e7a;
};

// Every kind a ResyncReport's corrections can name.
inline constexpr std::array<std::string_view, 3> kResyncKinds = {"missing", "stale", "gone"};

struct ResyncReport {
  absl::Time at = absl::InfinitePast();  // when the pass started (InfinitePast: never ran)
  absl::Duration took;
  absl::Duration paused;  // of `took`, the pauses between pages (ResyncOptions::pace)
  size_t pods = 0;        // pods listed
  size_t nodes = 0;       // nodes listed
  int64_t requests = 0;   // LIST requests (pages) sent
  // Repairs by kind ("missing", "stale", "gone"); only kinds with repairs appear.
  std::map<std::string, int64_t> corrections;
  // One line per repair (at most 100 per resource): "<resource> <kind> <key> uid=.. rv=a->b".
  std::vector<std::string> details;
  // Non-empty when a LIST failed or an informer did not run the comparison; the other
  // resource may still have been repaired.
  std::string error;
};

class Resyncer {
 public:
  using OnReport = std::function<void(const ResyncReport&)>;

  // Every pointer must outlive the resyncer. `on_report` (may be empty) gets every pass's report.
  Resyncer(kube::ApiClient* client, kube::Informer<kube::Pod>* pods,
           kube::Informer<kube::Node>* nodes, ResyncOptions options, OnReport on_report);
  ~Resyncer();
  Resyncer(const Resyncer&) = delete;
  Resyncer& operator=(const Resyncer&) = delete;

  // Starts the resyncer's thread (named "resync") unless options.period is zero.
  void Start();
  // Stops the thread; a pass in progress ends at its next LIST page, pause or wait. Idempotent.
  void Stop();

  // One pass now, on the calling thread. Passes before both informers have synced list
  // nothing and report an error.
  ResyncReport RunOnce();

  ResyncReport last() const;

 private:
  void Loop();
  bool Stopping() const;
  // Waits until `due` or Stop(); false when stopped.
  bool WaitUntil(absl::Time due);
  // Waits `pace` × page_took (capped), adding the wait to *paused; false when the resyncer
  // stopped meanwhile.
  bool PauseAfterPage(absl::Duration page_took, absl::Duration* paused);
  // Lists every object of T in pages; false (with *error) when a page failed.
  template <typename T>
  bool ListAll(std::vector<T>* items, std::string* resource_version, ResyncReport* report,
               std::string* error);
  template <typename T>
  void Resync(kube::Informer<T>* informer, std::string_view resource, ResyncReport* report);

  kube::ApiClient* const client_;
  kube::Informer<kube::Pod>* const pods_;
  kube::Informer<kube::Node>* const nodes_;
  const ResyncOptions options_;
  const OnReport on_report_;

  Mutex run_mu_;  // held for a whole pass
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ResyncReport last_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_;  // the loop thread only
  std::thread thread_;
};

}  // namespace tessera::accounting
