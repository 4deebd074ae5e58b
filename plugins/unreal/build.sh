#!/usr/bin/env bash
# Build and test the Unreal plugin's engine-independent C++ client core (IgiClientCore) with CMake + g++.
#
#   plugins/unreal/build.sh [--connection-file F] [--vectors DIR] [--filter SUBSTR] [--build-only]
#
# Builds into plugins/unreal/build/ (git-ignored) and runs build/igi_tests: codec/unit tests,
# conformance against ipc/vectors/*.msgpack, and live tests against the daemon named by the
# connection file (skipped with a message when none is given). Exit status: 0 all passed,
# 1 a test failed, 3 a build prerequisite is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
vectors="$here/../../ipc/vectors"
connection_file="${IGI_CONNECTION_FILE:-}"
filter=""
build_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --connection-file) connection_file="$2"; shift 2 ;;
    --vectors) vectors="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

missing=()
command -v cmake >/dev/null || missing+=("cmake")
command -v g++ >/dev/null || missing+=("g++")
command -v pkg-config >/dev/null || missing+=("pkg-config")
[[ -f /usr/include/zmq.h ]] || missing+=("libzmq3-dev")
[[ -f /usr/include/zmq.hpp ]] || missing+=("cppzmq-dev")
[[ -f /usr/include/openssl/hmac.h ]] || missing+=("libssl-dev")
# msgpack-c is used only by the tests (codec cross-check); required so that test is never silently dropped.
[[ -f /usr/include/msgpack.hpp ]] || missing+=("libmsgpack-cxx-dev")
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "missing build prerequisites; install them with: apt-get install ${missing[*]}" >&2
  exit 3
fi

cmake -S "$here" -B "$here/build" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$here/build" -j "${IGI_BUILD_JOBS:-2}"
[[ $build_only -eq 1 ]] && exit 0

args=(--vectors "$vectors")
[[ -n "$connection_file" ]] && args+=(--connection-file "$connection_file")
[[ -n "$filter" ]] && args+=(--filter "$filter")
exec "$here/build/igi_tests" "${args[@]}"
