// test_alloc.hpp - IgiClientCore tests: operator new instrumentation (test_alloc.cpp replaces the global operator
// new of igi_tests), so that tests can assert on what a decode allocates and make allocations fail on demand.
#pragma once

#include <cstddef>

namespace igi_test {

/// While alive, sums the bytes operator new hands out on this thread. Frees are not subtracted, so the total is an
/// upper bound of the peak: a robust size to assert on.
class AllocationCounter {
 public:
  AllocationCounter();
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  std::size_t total_bytes() const { return total_; }
  std::size_t largest_bytes() const { return largest_; }
  void Add(std::size_t bytes);

 private:
  AllocationCounter* outer_;
  std::size_t total_ = 0;
  std::size_t largest_ = 0;
};

/// While alive, operator new throws std::bad_alloc for every request of `bytes` or more, on every thread: an
/// exhausted heap on demand, for large allocations only.
class FailAllocationsFrom {
 public:
  explicit FailAllocationsFrom(std::size_t bytes);
  ~FailAllocationsFrom();
  FailAllocationsFrom(const FailAllocationsFrom&) = delete;
  FailAllocationsFrom& operator=(const FailAllocationsFrom&) = delete;
};

}  // namespace igi_test
