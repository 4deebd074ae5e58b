// test_alloc.cpp - IgiClientCore tests: the replaced global operator new behind test_alloc.hpp. The array and
// nothrow forms are not replaced: by default they call these two.
#include "test_alloc.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace {

thread_local igi_test::AllocationCounter* t_counter = nullptr;  // innermost live counter of this thread
std::atomic<std::size_t> g_fail_from{SIZE_MAX};

}  // namespace

void* operator new(std::size_t bytes) {
  if (bytes >= g_fail_from.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (t_counter != nullptr) t_counter->Add(bytes);
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace igi_test {

AllocationCounter::AllocationCounter() : outer_(t_counter) { t_counter = this; }
AllocationCounter::~AllocationCounter() { t_counter = outer_; }

void AllocationCounter::Add(std::size_t bytes) {
  total_ += bytes;
  if (bytes > largest_) largest_ = bytes;
}

FailAllocationsFrom::FailAllocationsFrom(std::size_t bytes) { g_fail_from = bytes; }
FailAllocationsFrom::~FailAllocationsFrom() { g_fail_from = SIZE_MAX; }

}  // namespace igi_test
