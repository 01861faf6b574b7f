// The threads of jaxlab's CPU kernels (jaxlab/engine/kernels/cpu.py builds them into one library): the calling
// thread and helper threads split a job's chunks between them. The helpers spin between calls (a decode step's
// one-row product of a 576 x 576 matrix takes ~20 microseconds, less than waking a sleeping thread; XLA's FFI thread
// pool started too late in 4,359 of 4,431 calls, benchmarks/NOTES.md 26) and sleep after the last job's linger time
// without work: kSpinMicroseconds for the int8 products, which come back to back, none for attention, one call a
// layer between XLA's own multi-threaded work, whose cores a spinning helper would take (NOTES 28). One set of
// helpers per process, shared by every kernel of the library.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace jaxlab {

constexpr int kSpinMicroseconds = 200;
constexpr int kMaxThreads = 8;

// One kernel call's work: chunks [0, chunks) that the caller and the helpers claim until none is left; chunk c is
// done by work(context, c). What each chunk computes does not depend on which thread runs it.
struct Job {
  void (*work)(const void* context, int64_t chunk);
  const void* context;
  int64_t chunks;
  int linger_us;  // how long a helper waits for the next job, spinning, before it sleeps
  std::atomic<int64_t> next{0}, done{0};
  Job(void (*w)(const void*, int64_t), const void* c, int64_t n, int linger = kSpinMicroseconds)
      : work(w), context(c), chunks(n), linger_us(linger) {}
  void Work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      work(context, c);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

class Helpers {
 public:
  explicit Helpers(int count) {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { Loop(); });
  }
  int count() const { return static_cast<int>(threads_.size()); }

  // Runs the job on this thread and the helpers; returns when every chunk is done and no helper holds the job.
  // A helper that never wakes costs time, not correctness: this thread claims whatever is left. Two threads
  // calling at once (programs of several CPU devices) are safe: each job is done by its caller, helped or not.
  void Run(Job* job) {
    if (threads_.empty() || job->chunks <= 1) {
      job->Work();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_.store(job, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    if (sleeping_.load(std::memory_order_acquire)) wake_.notify_all();
    job->Work();
    while (job->done.load(std::memory_order_acquire) < job->chunks) _mm_pause();
    // sequentially consistent: the store must be seen before inside_ is read, or a helper could take the job
    // after this thread found none inside it and returned (the job lives on this thread's stack)
    job_.store(nullptr, std::memory_order_seq_cst);
    while (inside_.load(std::memory_order_seq_cst)) _mm_pause();
  }

 private:
  void Loop() {
    uint64_t seen = generation_.load();
    int linger = kSpinMicroseconds;
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      for (int spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        _mm_pause();
        if ((linger == 0 || spins % 1024 == 0) &&
            std::chrono::steady_clock::now() - start >= std::chrono::microseconds(linger)) {
          std::unique_lock<std::mutex> lock(mu_);
          sleeping_.fetch_add(1);
          wake_.wait(lock, [&] { return generation_.load() != seen; });
          sleeping_.fetch_sub(1);
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      inside_.fetch_add(1, std::memory_order_seq_cst);
      if (Job* job = job_.load(std::memory_order_seq_cst)) {
        linger = job->linger_us;
        job->Work();
      }
      inside_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> sleeping_{0}, inside_{0};
};

inline int SchedulableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// Created on first use, kept for the process (never destroyed: threads outlive main). An inline function's static
// is one object in the whole library, whichever of its kernels calls first.
inline Helpers& TheHelpers() {
  static Helpers* helpers = new Helpers(std::max(0, std::min(kMaxThreads, SchedulableCpus()) - 1));
  return *helpers;
}

inline int Threads() { return 1 + TheHelpers().count(); }

// Runs the job with the helpers, or on the calling thread alone when its size (in the caller's units) is below
// alone_below: waking a helper would cost more than its share.
inline void RunSized(Job* job, int64_t size, int64_t alone_below) {
  if (size < alone_below)
    job->Work();
  else
    TheHelpers().Run(job);
}

}  // namespace jaxlab
