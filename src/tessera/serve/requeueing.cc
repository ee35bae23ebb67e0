#include "tessera/serve/requeueing.h"

#include <memory>
#include <string_view>
#include <utility>

namespace tessera::serve {
namespace {

extender::Requeuer::Parts WithSources(const Requeueing::Parts& parts) {
  Informers* informers = parts.informers;
  return extender::Requeuer::Parts{
      .vendor = parts.vendor,
      .ledger = parts.ledger,
      .quotas = parts.quotas,
      .verdicts = parts.verdicts,
      .pod = [informers](std::string_view uid) -> std::shared_ptr<const kube::Pod> {
        std::shared_ptr<const kube::Pod> pod = informers->pods().store().GetByUid(uid);
        if (pod == nullptr || !pod->node_name.empty() || pod->Deleting() || pod->Terminal()) {
          return nullptr;
        }
        return pod;
      },
      .client = parts.client,
      .clock = parts.clock};
}

}  // namespace

Requeueing::Requeueing(extender::Requeuer::Options options, absl::Duration period, Parts parts)
    : period_(period),
      parts_(std::move(parts)),
      requeuer_(std::move(options), WithSources(parts_)) {}

Requeueing::~Requeueing() { Stop(); }

void Requeueing::Start() {
  loop_ = std::make_unique<WorkQueue>(
      WorkQueue::Options{.name = "sched-requeue", .threads = 1, .tick = [this] { return Tick(); }});
}

void Requeueing::Stop() { loop_.reset(); }

absl::Duration Requeueing::Tick() {
  if (!parts_.leadership->IsLeader() || !parts_.informers->Synced()) {
    requeuer_.Observe();
    return period_;
  }
  requeuer_.Round();
  const uint64_t requeued = requeuer_.counts().requeued;
  parts_.metrics->RecordRequeues(static_cast<int64_t>(requeued - written_));
  written_ = requeued;
  return period_;
}

}  // namespace tessera::serve
