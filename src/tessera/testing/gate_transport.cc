#include "tessera/testing/gate_transport.h"

#include <utility>

namespace tessera::testing {

GateTransport::GateTransport(kube::Transport* inner, std::string method, std::string path_part)
    : inner_(inner), method_(std::move(method)), path_part_(std::move(path_part)) {}

void GateTransport::Send(kube::Request request, kube::ResponseCallback done) {
  if (request.method == method_ && request.path.find(path_part_) != std::string::npos) {
    MutexLock l(&mu_);
    ++held_;
    cv_.SignalAll();
    while (!open_) {
      cv_.Wait(&mu_);
    }
  }
  inner_->Send(std::move(request), std::move(done));
}

kube::StreamId GateTransport::Stream(kube::Request request, kube::StreamHandlers handlers) {
  return inner_->Stream(std::move(request), std::move(handlers));
}

void GateTransport::Cancel(kube::StreamId id) { inner_->Cancel(id); }

void GateTransport::WaitHeld(int n) {
  MutexLock l(&mu_);
  while (held_ < n) {
    cv_.Wait(&mu_);
  }
}

int GateTransport::held() {
  MutexLock l(&mu_);
  return held_;
}

void GateTransport::Open() {
  MutexLock l(&mu_);
  open_ = true;
  cv_.SignalAll();
}

}  // namespace tessera::testing
