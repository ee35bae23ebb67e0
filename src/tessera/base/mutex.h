// File: tessera/base/mutex.h
//
// tessera::Mutex is a std::mutex annotated for clang's -Wthread-safety analysis, and
// tessera::MutexLock its RAII guard. Use these instead of absl::Mutex: Debian's prebuilt Abseil
// is not TSan-instrumented, so absl::Mutex produces false data-race reports under TSan.
//
//   class Counter {
//    public:
//     void Inc() { MutexLock l(&mu_); ++n_; }
//    private:
//     Mutex mu_;
//     int n_ ABSL_GUARDED_BY(mu_) = 0;
//   };
//
// Thread safety: a Mutex may be locked from any thread; it is not recursive.
#pragma once

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace tessera {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Documents (for the analysis) that the caller holds the lock; does nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // The underlying mutex, for CondVar only.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable that waits on a tessera::Mutex the caller already holds.
class CondVar {
 public:
  // Atomically releases `mu`, waits for a notification, and re-acquires `mu`. Spurious
  // wake-ups are possible: always wait in a loop that re-checks the condition.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, but returns after at most `timeout`. Returns false on timeout.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
    const bool notified = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tessera
