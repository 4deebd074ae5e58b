// test_framework.hpp - IgiClientCore tests: a minimal self-registering test runner.
//
// Each TEST(name) registers a function; CHECK records a failure and continues, REQUIRE stops the
// test, SKIP(reason) marks it skipped. main() prints one line per test and ends with exactly
// "N passed, N failed".
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace igi_test {

struct Options {
  std::string vectors_dir;      ///< folder holding vectors.msgpack and invalid.msgpack
  std::string connection_file;  ///< daemon connection file for live tests ("" = skip them)
  std::string filter;           ///< run only tests whose name contains this
  std::string bundle_dir;       ///< the daemon bundle folder for the launcher tests ("" = skip them)
};

const Options& GetOptions();

struct Failure {};  // thrown by REQUIRE to abort the current test
struct Skipped {
  std::string reason;
};

using TestFn = std::function<void()>;
int Register(const char* name, TestFn fn);
void RecordFailure(const char* file, int line, const std::string& what);

}  // namespace igi_test

#define IGI_TEST_CAT2(a, b) a##b
#define IGI_TEST_CAT(a, b) IGI_TEST_CAT2(a, b)
#define TEST(name)                                                                          \
  static void IGI_TEST_CAT(test_fn_, name)();                                               \
  static const int IGI_TEST_CAT(test_reg_, name) =                                          \
      igi_test::Register(#name, &IGI_TEST_CAT(test_fn_, name));                             \
  static void IGI_TEST_CAT(test_fn_, name)()

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) igi_test::RecordFailure(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

#define CHECK_MSG(cond, msg)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream igi_oss_;                                                        \
      igi_oss_ << "CHECK(" #cond ") " << msg;                                             \
      igi_test::RecordFailure(__FILE__, __LINE__, igi_oss_.str());                        \
    }                                                                                     \
  } while (0)

#define REQUIRE(cond)                                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      igi_test::RecordFailure(__FILE__, __LINE__, "REQUIRE(" #cond ")");     \
      throw igi_test::Failure{};                                             \
    }                                                                        \
  } while (0)

#define CHECK_EQ(a, b) CHECK_MSG((a) == (b), "\n    left:  " << (a) << "\n    right: " << (b))

#define CHECK_THROWS_AS(expr, Type)                                                        \
  do {                                                                                     \
    bool igi_caught_ = false;                                                              \
    try {                                                                                  \
      (void)(expr);                                                                        \
    } catch (const Type&) {                                                                \
      igi_caught_ = true;                                                                  \
    } catch (const std::exception& e) {                                                    \
      igi_test::RecordFailure(__FILE__, __LINE__,                                          \
                              std::string("wrong exception from " #expr ": ") + e.what()); \
      igi_caught_ = true;                                                                  \
    }                                                                                      \
    if (!igi_caught_) igi_test::RecordFailure(__FILE__, __LINE__, #expr " did not throw " #Type); \
  } while (0)

#define SKIP(reason) throw igi_test::Skipped{reason}
