// test_main.cpp - IgiClientCore tests: runner entry point and argument parsing.
//
// Usage: igi_tests [--vectors DIR] [--connection-file PATH] [--bundle DIR] [--filter SUBSTR]
// IGI_CONNECTION_FILE, IGI_VECTORS_DIR and IGI_DAEMON_BUNDLE are read when the flags are absent.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

#include "test_framework.hpp"

namespace igi_test {
namespace {

struct Entry {
  const char* name;
  TestFn fn;
};

std::vector<Entry>& Registry() {
  static std::vector<Entry> tests;
  return tests;
}

Options g_options;
int g_current_failures = 0;

}  // namespace

const Options& GetOptions() { return g_options; }

int Register(const char* name, TestFn fn) {
  Registry().push_back({name, std::move(fn)});
  return 0;
}

void RecordFailure(const char* file, int line, const std::string& what) {
  ++g_current_failures;
  std::cout << "    " << file << ":" << line << ": " << what << "\n";
}

}  // namespace igi_test

int main(int argc, char** argv) {
  using namespace igi_test;
  if (const char* env = std::getenv("IGI_CONNECTION_FILE")) g_options.connection_file = env;
  if (const char* env = std::getenv("IGI_VECTORS_DIR")) g_options.vectors_dir = env;
  if (const char* env = std::getenv("IGI_DAEMON_BUNDLE")) g_options.bundle_dir = env;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "missing value for " << argv[i] << "\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (std::strcmp(argv[i], "--vectors") == 0) {
      g_options.vectors_dir = value();
    } else if (std::strcmp(argv[i], "--connection-file") == 0) {
      g_options.connection_file = value();
    } else if (std::strcmp(argv[i], "--bundle") == 0) {
      g_options.bundle_dir = value();
    } else if (std::strcmp(argv[i], "--filter") == 0) {
      g_options.filter = value();
    } else {
      std::cerr << "usage: igi_tests [--vectors DIR] [--connection-file PATH] [--bundle DIR] [--filter SUBSTR]\n";
      return 2;
    }
  }
  int passed = 0, failed = 0, skipped = 0;
  for (const Entry& t : Registry()) {
    if (!g_options.filter.empty() && std::strstr(t.name, g_options.filter.c_str()) == nullptr) continue;
    g_current_failures = 0;
    std::cout << "[ RUN  ] " << t.name << std::endl;
    bool skip = false;
    std::string skip_reason;
    try {
      t.fn();
    } catch (const Failure&) {
    } catch (const Skipped& s) {
      skip = true;
      skip_reason = s.reason;
    } catch (const std::exception& e) {
      RecordFailure(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      RecordFailure(__FILE__, __LINE__, "uncaught non-std exception");
    }
    if (skip && g_current_failures == 0) {
      ++skipped;
      std::cout << "[ SKIP ] " << t.name << ": " << skip_reason << std::endl;
    } else if (g_current_failures == 0) {
      ++passed;
      std::cout << "[  OK  ] " << t.name << std::endl;
    } else {
      ++failed;
      std::cout << "[ FAIL ] " << t.name << std::endl;
    }
  }
  if (skipped > 0) std::cout << skipped << " skipped" << std::endl;
  std::cout << passed << " passed, " << failed << " failed" << std::endl;
  return failed == 0 ? 0 : 1;
}
