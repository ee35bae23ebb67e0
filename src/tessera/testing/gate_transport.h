// File: tessera/testing/gate_transport.h
//
// Test-only (library tessera::testing). A kube::Transport that holds requests of one method and
// path until the test opens it, so that a test can act while a writer or sender is on the wire:
//
//   testing::GateTransport gate(env.faults(), "PATCH", "/api/v1/namespaces/default/pods/");
//   ... start the code under test over &gate ...
//   gate.WaitHeld(1);  // the PATCH is on the wire
//   ... act ...
//   gate.Open();
//
// Thread safety: thread-safe.
#pragma once

#include <string>

#include "tessera/base/mutex.h"
#include "tessera/kube/transport.h"

namespace tessera::testing {

// Forwards to `inner`, but holds every request with `method` whose path contains `path_part`
// until Open(). Streams pass through.
class GateTransport : public kube::Transport {
 public:
  GateTransport(kube::Transport* inner, std::string method, std::string path_part);

  void Send(kube::Request request, kube::ResponseCallback done) override;
  kube::StreamId Stream(kube::Request request, kube::StreamHandlers handlers) override;
  void Cancel(kube::StreamId id) override;

  // Blocks until `n` requests have been held in all.
  void WaitHeld(int n);
  int held();
  // Lets the held requests and every later one through.
  void Open();

 private:
  kube::Transport* const inner_;
  const std::string method_;
  const std::string path_part_;
  Mutex mu_;
  CondVar cv_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::testing
