#include "tessera/serve/preempting.h"

#include <memory>

namespace tessera::serve {

Preempting::Preempting(absl::Duration period, Parts parts) : period_(period), parts_(parts) {}

Preempting::~Preempting() { Stop(); }

void Preempting::Start() {
  loop_ = std::make_unique<WorkQueue>(
      WorkQueue::Options{.name = "sched-preempt", .threads = 1, .tick = [this] { return Tick(); }});
}

void Preempting::Stop() { loop_.reset(); }

absl::Duration Preempting::Tick() {
  if (!parts_.leadership->IsLeader() || !parts_.informers->Synced()) {
    return period_;
  }
  parts_.self->Round();
  const extender::SelfPreemptor::Counts now = parts_.self->counts();
  parts_.metrics->RecordSelfEvictions(static_cast<int64_t>(now.evicted - counted_.evicted),
                                      static_cast<int64_t>(now.refused - counted_.refused));
  counted_ = now;
  return period_;
}

}  // namespace tessera::serve
