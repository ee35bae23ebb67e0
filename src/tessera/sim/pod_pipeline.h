// File: tessera/sim/pod_pipeline.h
//
// PodPipeline drives each pod of a `tessera simulate` workload through its life as tasks on the
// run's queues: created from the scenario's shapes, filtered and bound through the extender
// (the emulated kube-scheduler, with its backoff queue; on the real control plane
// kube-scheduler binds and RealKubelet reports it), allocated by the node's device plugin,
// started and finished by the kubelet, removed by a TTL controller, or deleted (gracefully or
// forced) on the workload's or a fault's request. Every step records its stage and counters in
// the run book; a failed API call is retried on the queue. The run's seeded random generator is
// here: the workload's choices, lifetimes and the faults' picks all draw from it.
//
// Thread safety: every method may be called from any thread (the tasks run on the queues'
// workers); OnBound and OnTerminating may be called with the run book's mutex held.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/observer.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"
#include "tessera/sim/task_queue.h"

namespace tessera::sim {

class PodPipeline {
 public:
  struct Options {
    const Scenario* scenario = nullptr;
    bool real = false;  // the real control plane: kube-scheduler schedules
    RunBook* book = nullptr;
    kube::Transport* api = nullptr;          // the workload's and the controllers' connection
    kube::Transport* node = nullptr;         // the kubelets' connection
    kube::ApiClient* node_client = nullptr;  // the device plugins' client
    ExtenderClient* extender = nullptr;      // apisim: the scheduler under test
    Observer* observer = nullptr;            // a device plugin's failure is a violation
    TaskQueue* tasks = nullptr;              // the workload and the scheduler
    TaskQueue* node_tasks = nullptr;         // device plugins and kubelets
    Clock* clock = nullptr;
  };
  explicit PodPipeline(Options options);

  // Creates the pod `name` (already in the run book) and takes it through its life.
  void CreateTask(const std::string& name);
  // apisim: the pods kube-scheduler's queue says to try now.
  void Retry(const SchedulingQueue::Now& names);
  // kReal: the pod was bound; the node's plugin and kubelet take it.
  void OnBound(const std::string& name);
  // kReal: the pod is being deleted; its kubelet finishes it.
  void OnTerminating(const std::string& name);
  // `n` random live pods deleted; forced: `n` bound pods, with grace 0 (the seed bug's deletions
  // of running pods).
  void DeleteRandomLive(int n, bool force = false);
  // `n` random pods pending, bound or running (only bound or running with `bound_only`).
  std::vector<std::string> PickLive(int n, bool bound_only = false);
  void DeleteTask(const std::string& name, bool force);
  // The next number of the run's seeded generator.
  uint64_t Rand();

 private:
  void ScheduleTask(const std::string& name);
  void AllocateTask(const std::string& name, int tries);
  void StartTask(const std::string& name);
  void FinishTask(const std::string& name);
  void CleanupTask(const std::string& name);
  void TerminateTask(const std::string& name);
  absl::Time Now() const { return options_.clock->Now(); }

  const Options options_;
  Workload workload_;
  Mutex rng_mutex_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mutex_);
};

}  // namespace tessera::sim
