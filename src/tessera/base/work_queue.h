// File: tessera/base/work_queue.h
//
// WorkQueue runs tasks on a fixed pool of named worker threads, in the order they were pushed,
// for components that hand work to background threads (the extender's event, patch and verdict
// writers). One worker runs the tasks one at a time in order; several start them in order and
// may overlap them (a caller that needs the order of related tasks keeps it itself, as
// PatchWriter does for one pod's patches).
//
//   WorkQueue queue({.name = "sched-events", .threads = 1, .limit = 1000});
//   if (!queue.Push([this, e] { Send(e); })) { /* full: the task was dropped */ }
//   queue.Flush();  // waits until nothing is queued or running
//
// A queue with a limit refuses (drops) a task pushed while `limit` tasks wait; dropped()
// counts them. Stop, and the destructor, end the workers after the queued tasks ran (kDrain)
// or destroy the queued tasks unrun (kDiscard); a running task always finishes. Push after Stop
// returns false. A worker that also keeps timers (the informer's retries and resync) is given a
// `tick`: each worker calls it before it takes a task or waits, and waits at most the real time
// it returns.
//
// Thread safety: every method may be called from any thread; Stop and the destructor not from a
// task. Tasks and `tick` run without the queue's lock and may call Push, size and dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

#include "tessera/base/mutex.h"

namespace tessera {

class WorkQueue {
 public:
  using Task = absl::AnyInvocable<void()>;
  enum class OnStop : uint8_t { kDrain, kDiscard };
  struct Options {
    std::string name;  // the workers' thread name (its first 15 bytes), for `top -H` and perf
    int threads = 1;   // workers; 0: a queue that refuses every task
    size_t limit = std::numeric_limits<size_t>::max();  // tasks queued beyond this are dropped
    OnStop on_stop = OnStop::kDrain;
    // Optional: called by each worker before it takes a task or waits; returns the longest
    // wait for a task before it is called again (<= 0: none; InfiniteDuration: until a task).
    std::function<absl::Duration()> tick = nullptr;
  };

  explicit WorkQueue(Options options);
  ~WorkQueue();  // Stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; false (the task is destroyed unrun) when the queue is full, stopped or has no
  // workers.
  bool Push(Task task);
  // Blocks until no task is queued or running.
  void Flush();
  // Ends the workers (see above) and joins them. Idempotent.
  void Stop();

  // Tasks queued, not yet started.
  size_t size() const;
  // Tasks refused by a full queue since construction.
  uint64_t dropped() const;

 private:
  void Work();

  const Options options_;
  mutable Mutex mu_;
  CondVar work_cv_;  // tasks_ non-empty, or stopping_
  CondVar idle_cv_;  // a task finished
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  Mutex join_mu_;  // serialises Stop
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace tessera
