#include "tessera/base/work_queue.h"

#include <utility>

#include <pthread.h>

namespace tessera {

WorkQueue::WorkQueue(Options options) : options_(std::move(options)) {
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), options_.name.substr(0, 15).c_str());
      Work();
    });
  }
}

WorkQueue::~WorkQueue() { Stop(); }

bool WorkQueue::Push(Task task) {
  {
    MutexLock l(&mu_);
    if (stopping_ || options_.threads <= 0) {
      return false;
    }
    if (tasks_.size() >= options_.limit) {
      ++dropped_;
      return false;
    }
    tasks_.push_back(std::move(task));
  }
  // One worker is enough; after the unlock, which it needs at once.
  work_cv_.Signal();
  return true;
}

void WorkQueue::Flush() {
  MutexLock l(&mu_);
  while (!tasks_.empty() || running_ > 0) {
    idle_cv_.Wait(&mu_);
  }
}

void WorkQueue::Stop() {
  MutexLock join(&join_mu_);
  std::deque<Task> discarded;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    if (options_.on_stop == OnStop::kDiscard) {
      discarded.swap(tasks_);
    }
  }
  work_cv_.SignalAll();
  idle_cv_.SignalAll();
  for (std::thread& t : threads_) {
    t.join();
  }
  threads_.clear();
}

size_t WorkQueue::size() const {
  MutexLock l(&mu_);
  return tasks_.size();
}

uint64_t WorkQueue::dropped() const {
  MutexLock l(&mu_);
  return dropped_;
}

void WorkQueue::Work() {
  for (;;) {
    const absl::Duration wait = options_.tick ? options_.tick() : absl::InfiniteDuration();
    Task task;
    {
      MutexLock l(&mu_);
      if (wait == absl::InfiniteDuration()) {
        while (tasks_.empty() && !stopping_) {
          work_cv_.Wait(&mu_);
        }
      } else if (tasks_.empty() && !stopping_ && wait > absl::ZeroDuration()) {
        work_cv_.WaitFor(&mu_, absl::ToChronoMicroseconds(wait));
      }
      if (tasks_.empty()) {
        if (stopping_) {
          return;  // stopping, and every task ran (or was discarded)
        }
        continue;  // the tick's wait is over: tick again
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // its captures go before the next task, as a finished task's should
    {
      MutexLock l(&mu_);
      --running_;
    }
    idle_cv_.SignalAll();
  }
}

}  // namespace tessera
