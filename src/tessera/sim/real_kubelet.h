// File: tessera/sim/real_kubelet.h
//
// RealKubelet is the node side of a `tessera simulate` run on the real control plane: it sees
// what kube-scheduler and kube-apiserver did to the workload's pods, through an informer and a
// paged poll every 2 s as its backstop. A pod bound by kube-scheduler moves to kBound in the run
// book (on_bound then starts its device plugin and kubelet); an unschedulable one is counted; a
// bound pod being deleted is handed to on_terminating once. It also plays kube-scheduler's
// kubelet: a kube-scheduler that exited (stock kube-scheduler exits when it loses its Lease) is
// started again and recorded as the fault "scheduler_restart".
//
// Errors: a poll that fails is skipped (the API server restarting); a failed restart is logged.
//
// Thread safety: Start and Stop from the run's thread. on_bound and on_terminating are called
// with the run book's mutex held.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/control_plane.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

class RealKubelet {
 public:
  struct Options {
    const Scenario* scenario = nullptr;
    RunBook* book = nullptr;
    kube::ApiClient* client = nullptr;  // the informer's
    kube::Transport* poll = nullptr;    // the poll's (a connection of its own)
    RealControlPlane* control_plane = nullptr;
    Clock* clock = nullptr;
    std::function<void(const std::string& name)> on_bound;
    std::function<void(const std::string& name)> on_terminating;
  };
  explicit RealKubelet(Options options) : options_(std::move(options)) {}
  ~RealKubelet() { Stop(); }
  RealKubelet(const RealKubelet&) = delete;
  RealKubelet& operator=(const RealKubelet&) = delete;

  void Start();
  void Stop();

 private:
  void PollLoop();
  void Poll();
  void SuperviseLoop();
  void OnPodSeen(const kube::Pod& pod);
  // The path prefix of the workload's pods: one namespace, or all of them.
  std::string PodScope() const;

  const Options options_;
  std::unique_ptr<kube::Informer<kube::Pod>> informer_;
  std::atomic<bool> stop_{false};
  std::thread poll_thread_, supervise_thread_;
};

}  // namespace tessera::sim
