#include "tessera/base/mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

class Counter {
 public:
  void Inc() {
    MutexLock lock(&mu_);
    ++n_;
    cv_.SignalAll();
  }
  int WaitFor(int target) {
    MutexLock lock(&mu_);
    while (n_ < target) {
      cv_.Wait(&mu_);
    }
    return n_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(MutexTest, ConcurrentIncrementsAreSerialised) {
  Counter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        counter.Inc();
      }
    });
  }
  EXPECT_EQ(counter.WaitFor(40000), 40000);
  for (auto& th : threads) {
    th.join();
  }
}

TEST(MutexTest, WaitForTimesOut) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_FALSE(cv.WaitFor(&mu, std::chrono::milliseconds(5)));
}

}  // namespace
}  // namespace tessera
