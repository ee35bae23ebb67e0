// File: tessera/sim/task_queue.h
//
// TaskQueue runs closures at given times on a small pool of worker threads: the simulator's
// pod pipeline, node agents and faults each post onto one. A task whose time has come runs on
// the first free worker, earlier times first and, at equal times, in posting order. Workers
// check the queue at least every 200 ms, so a task posted for the past runs at once.
//
// Times are read from the injected Clock; the waits themselves are real (condition variable).
//
// Thread safety: Post and pending from any thread, tasks included; Start and Stop from the
// owner. Stop joins the workers and drops the tasks still queued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"

namespace tessera::sim {

class TaskQueue {
 public:
  explicit TaskQueue(Clock* clock) : clock_(clock) {}
  ~TaskQueue() { Stop(); }
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  void Post(absl::Time at, std::function<void()> fn);
  void Start(int workers);
  void Stop();
  size_t pending();

 private:
  struct Item {
    absl::Time at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Item& other) const {
      return at != other.at ? at > other.at : seq > other.seq;
    }
  };
  void Work();

  Clock* const clock_;
  Mutex mu_;
  CondVar wake_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> items_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::sim
