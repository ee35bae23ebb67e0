#include "tessera/base/work_queue.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include <pthread.h>

namespace tessera {
namespace {

// A gate tasks wait at until the test opens it.
class Gate {
 public:
  void Open() {
    MutexLock l(&mu_);
    open_ = true;
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock l(&mu_);
    while (!open_) {
      cv_.Wait(&mu_);
    }
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(WorkQueueTest, OneWorkerRunsTasksInPushOrderOnItsNamedThread) {
  Mutex mu;
  std::vector<int> ran;
  std::string name;
  WorkQueue queue({.name = "test-queue-worker-long", .threads = 1});
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(queue.Push([&, i] {
      char buf[32] = {};
      pthread_getname_np(pthread_self(), buf, sizeof(buf));
      MutexLock l(&mu);
      ran.push_back(i);
      name = buf;
    }));
  }
  queue.Flush();
  MutexLock l(&mu);
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(ran[i], i);
  }
  EXPECT_EQ(name, "test-queue-work");  // the first 15 bytes
}

TEST(WorkQueueTest, FullQueueDropsTheNewTaskAndCountsIt) {
  Gate gate;
  Gate started;
  std::atomic<int> ran{0};
  WorkQueue queue({.name = "test-cap", .threads = 1, .limit = 2});
  ASSERT_TRUE(queue.Push([&] {
    started.Open();
    gate.Wait();
    ++ran;
  }));
  started.Wait();  // the running task no longer counts against the limit
  EXPECT_TRUE(queue.Push([&] { ran += 10; }));
  EXPECT_TRUE(queue.Push([&] { ran += 100; }));
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_FALSE(queue.Push([&] { ran += 1000; }));
  EXPECT_EQ(queue.dropped(), 1u);
  gate.Open();
  queue.Flush();
  EXPECT_EQ(ran.load(), 111);
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.dropped(), 1u);
}

TEST(WorkQueueTest, StopRunsQueuedTasksWhenDraining) {
  Gate gate;
  std::atomic<int> ran{0};
  WorkQueue queue({.name = "test-drain", .threads = 1});
  ASSERT_TRUE(queue.Push([&] {
    gate.Wait();
    ++ran;
  }));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(queue.Push([&] { ++ran; }));
  }
  std::thread opener([&] { gate.Open(); });
  queue.Stop();
  opener.join();
  EXPECT_EQ(ran.load(), 6);
  EXPECT_FALSE(queue.Push([&] { ++ran; }));
  queue.Stop();  // idempotent
  EXPECT_EQ(ran.load(), 6);
}

TEST(WorkQueueTest, StopDestroysQueuedTasksWhenDiscarding) {
  Gate gate;
  Gate started;
  std::atomic<int> ran{0};
  auto token = std::make_shared<int>(0);
  WorkQueue queue({.name = "test-discard", .threads = 1, .on_stop = WorkQueue::OnStop::kDiscard});
  ASSERT_TRUE(queue.Push([&] {
    started.Open();
    gate.Wait();
    ++ran;
  }));
  started.Wait();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(queue.Push([&ran, token] { ++ran; }));
  }
  EXPECT_EQ(token.use_count(), 6);
  std::thread opener([&] {
    while (queue.Push([] {})) {  // until Stop has begun (and discarded what was queued)
      std::this_thread::yield();
    }
    gate.Open();
  });
  queue.Stop();
  opener.join();
  EXPECT_EQ(ran.load(), 1);  // the running task finished; the queued ones never ran
  EXPECT_EQ(token.use_count(), 1);
}

TEST(WorkQueueTest, WorkersRunTasksConcurrently) {
  // Each task waits for all the others to start: only four workers at once can finish.
  constexpr int kWorkers = 4;
  Mutex mu;
  CondVar cv;
  int started = 0;
  std::atomic<int> ran{0};
  WorkQueue queue({.name = "test-pool", .threads = kWorkers});
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(queue.Push([&] {
      MutexLock l(&mu);
      ++started;
      cv.SignalAll();
      while (started < kWorkers) {
        cv.Wait(&mu);
      }
      ++ran;
    }));
  }
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(queue.Push([&] { ++ran; }));
  }
  queue.Flush();
  EXPECT_EQ(ran.load(), kWorkers + 1000);
}

TEST(WorkQueueTest, ConcurrentPushesAllRun) {
  std::atomic<int> ran{0};
  WorkQueue queue({.name = "test-push", .threads = 2});
  std::vector<std::thread> pushers;
  for (int t = 0; t < 4; ++t) {
    pushers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        EXPECT_TRUE(queue.Push([&] { ++ran; }));
      }
    });
  }
  for (std::thread& t : pushers) {
    t.join();
  }
  queue.Stop();
  EXPECT_EQ(ran.load(), 4000);
}

TEST(WorkQueueTest, TasksMayPush) {
  std::atomic<int> ran{0};
  WorkQueue queue({.name = "test-repush", .threads = 1});
  ASSERT_TRUE(queue.Push([&] {
    ++ran;
    EXPECT_TRUE(queue.Push([&] { ++ran; }));
  }));
  queue.Flush();
  EXPECT_EQ(ran.load(), 2);
}

TEST(WorkQueueTest, TickRunsBeforeEachTaskAndBoundsTheWait) {
  Mutex mu;
  CondVar cv;
  std::vector<std::string> log;
  absl::Duration next_wait = absl::InfiniteDuration();
  auto note = [&](std::string what) {
    MutexLock l(&mu);
    log.push_back(std::move(what));
    cv.SignalAll();
  };
  WorkQueue queue({.name = "test-tick", .threads = 1, .tick = [&] {
                     note("tick");
                     MutexLock l(&mu);
                     return next_wait;
                   }});
  ASSERT_TRUE(queue.Push([&] { note("a"); }));
  ASSERT_TRUE(queue.Push([&] { note("b"); }));
  queue.Flush();
  {
    MutexLock l(&mu);
    ASSERT_GE(log.size(), 4u);
    // However the pushes met the worker: a tick before each task (and one after the last).
    EXPECT_EQ(std::vector<std::string>(log.begin(), log.begin() + 4),
              (std::vector<std::string>{"tick", "a", "tick", "b"}));
  }
  // A finite wait ends without a task: the worker ticks again, and again.
  {
    MutexLock l(&mu);
    next_wait = absl::Milliseconds(1);
  }
  ASSERT_TRUE(queue.Push([&] { note("c"); }));
  {
    MutexLock l(&mu);
    const size_t before = log.size();
    while (log.size() < before + 5) {
      ASSERT_TRUE(cv.WaitFor(&mu, std::chrono::seconds(10))) << "no tick after a finite wait";
    }
  }
  queue.Stop();  // ends a worker that waits between ticks
  MutexLock l(&mu);
  EXPECT_EQ(std::count(log.begin(), log.end(), "c"), 1);
}

TEST(WorkQueueTest, WithoutWorkersEveryTaskIsRefused) {
  WorkQueue queue({.name = "test-none", .threads = 0});
  EXPECT_FALSE(queue.Push([] {}));
  queue.Flush();
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.dropped(), 0u);
}

}  // namespace
}  // namespace tessera
