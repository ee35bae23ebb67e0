#include "tessera/sim/task_queue.h"

#include <algorithm>
#include <utility>

namespace tessera::sim {

void TaskQueue::Post(absl::Time at, std::function<void()> fn) {
  MutexLock l(&mu_);
  items_.push(Item{at, next_seq_++, std::move(fn)});
  wake_.Signal();
}

void TaskQueue::Start(int workers) {
  for (int i = 0; i < workers; ++i) {
    threads_.emplace_back([this] { Work(); });
  }
}

void TaskQueue::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  for (std::thread& t : threads_) {
    t.join();
  }
  threads_.clear();
}

size_t TaskQueue::pending() {
  MutexLock l(&mu_);
  return items_.size();
}

void TaskQueue::Work() {
  while (true) {
    std::function<void()> fn;
    {
      MutexLock l(&mu_);
      while (!stop_) {
        if (!items_.empty() && items_.top().at <= clock_->Now()) {
          break;
        }
        const absl::Duration wait =
            items_.empty() ? absl::Milliseconds(200)
                           : std::min(absl::Milliseconds(200), items_.top().at - clock_->Now());
        wake_.WaitFor(&mu_, absl::ToChronoMicroseconds(std::max(wait, absl::Microseconds(100))));
      }
      if (stop_) {
        return;
      }
      fn = std::move(const_cast<Item&>(items_.top()).fn);
      items_.pop();
    }
    fn();
  }
}

}  // namespace tessera::sim
