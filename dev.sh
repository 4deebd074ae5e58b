#!/usr/bin/env bash
# The two set-up commands of the README, each self-bootstrapping on a fresh machine:
#   ./dev.sh demo [ARGS]   daemon + headless sample harness on the embedded default model
#   ./dev.sh test [PYTEST ARGS]   lint and types (without PYTEST ARGS), then the test suite (Python, C#, C++)
#   ./dev.sh lint                 ruff check, ruff format --check, mypy (configured in pyproject.toml)
#   ./dev.sh bundle [--no-model] [--force]   the self-contained daemon bundle, build/bundle/igi-daemon (docs/bundle.md)
# Set-up is idempotent: a venv in .venv (llama-cpp-python 0.3.36 built from source with the project's llama.cpp
# patches, ~4 min on 2 cores),
# the default model in the user cache, and for `test` the Debian packages the plugins build with.
set -euo pipefail
CALLER_DIR=$PWD  # where the user typed the command: relative paths of `demo`'s arguments are read from here
cd "$(dirname "$0")"
VENV=${IGI_VENV:-.venv}
PY=${PYTHON:-python3}

APT_PKGS=(mono-mcs mono-devel libnunit-cil-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libssl-dev cmake g++ pkg-config)

ensure_apt() {
  local missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "[igi] installing Debian packages: ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

LCP_VERSION=0.3.36

# llama-cpp-python built from its sdist with the project's llama.cpp patches (patches/llama.cpp, applied by
# .ci/patch_llama_cpp.sh); rebuilt when the patch series changes. CMAKE_ARGS passes through (e.g. a CUDA build).
# llama.cpp's AMX matmul (ggml-cpu/amx, picked at run time on CPUs with AMX such as Xeon Sapphire Rapids) crashes
# in ggml_backend_amx_mul_mat on the embedded model (ggml-org/llama.cpp#20824, open upstream), so it is not compiled:
# explicit -mno-amx-* win over the -march=native of GGML_NATIVE; the CPU repack paths (AVX2/AVX-512) stay.
no_amx_flags() {
  [ "$(uname -m)" = x86_64 ] || return 0
  if echo 'int main(void){return 0;}' | ${CC:-cc} -x c -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -o /dev/null - 2>/dev/null; then
    echo "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  fi
}

ensure_llama_cpp() {
  local stamp="$VENV/.igi-llama-cpp"
  local want noamx
  noamx=$(no_amx_flags)
  want="$LCP_VERSION $(cat patches/llama.cpp/*.patch | sha256sum | cut -d' ' -f1) ${noamx// /,}"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 0
  echo "[igi] building llama-cpp-python $LCP_VERSION with the project's llama.cpp patches (a few minutes)"
  local tmp
  tmp=$(mktemp -d)
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$LCP_VERSION" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  local src
  src=$(ls -d "$tmp"/llama_cpp_python-*/)
  .ci/patch_llama_cpp.sh "$src"
  CFLAGS="${CFLAGS:-} $noamx" CXXFLAGS="${CXXFLAGS:-} $noamx" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$src"
  rm -rf "$tmp"
  echo "$want" > "$stamp"
}

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[igi] creating $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  fi
  ensure_llama_cpp
  local stamp="$VENV/.igi-installed"
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[igi] installing igi-sdk and its dependencies (first time builds llama-cpp-python: a few minutes)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" > "$stamp"
  fi
}

ensure_model() {
  "$VENV/bin/python" -c 'from igi_sdk.model_store import default_model_path as d; print("[igi] default model:", d())'
}

lint() {
  echo "[igi] lint: ruff check, ruff format --check, mypy"
  "$VENV/bin/python" -m ruff check .
  "$VENV/bin/python" -m ruff format --check .
  "$VENV/bin/python" -m mypy
}

# `demo`'s path arguments made absolute against CALLER_DIR (dev.sh runs from the repository, the user may not):
# --out, --replot, and --model / --mmproj where they name a file (not `default` or `synthetic:NAME`). Sets HARNESS_ARGS.
abs_path() {  # FLAG VALUE
  case "$1:$2" in
    *:/* | *:~* | *: | --model:default | --model:synthetic:* | --mmproj:synthetic:*) printf '%s' "$2" ;;
    *) printf '%s/%s' "$CALLER_DIR" "$2" ;;
  esac
}
harness_path_args() {
  local prev="" a
  HARNESS_ARGS=()
  for a in "$@"; do
    case "$prev" in
      --out | --replot | --model | --mmproj) a=$(abs_path "$prev" "$a") ;;
      *)
        case "$a" in
          --out=* | --replot=* | --model=* | --mmproj=*) a="${a%%=*}=$(abs_path "${a%%=*}" "${a#*=}")" ;;
        esac
        ;;
    esac
    HARNESS_ARGS+=("$a")
    prev=$a
  done
}

cmd=${1:-}
shift || true
case "$cmd" in
  demo)
    ensure_venv
    ensure_model
    harness_path_args "$@"
    exec "$VENV/bin/python" samples/harness.py ${HARNESS_ARGS[@]+"${HARNESS_ARGS[@]}"}
    ;;
  bundle)
    ensure_venv
    ensure_model
    exec "$VENV/bin/python" packaging/build_bundle.py "$@"
    ;;
  test)
    ensure_apt
    ensure_venv
    ensure_model
    [ $# -eq 0 ] && lint  # the whole suite: lint first (a run of chosen tests skips it)
    # no arguments: every folder under tests/ (testpaths in pyproject.toml; unit, property, process, integration, ...)
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  lint)
    ensure_venv
    lint
    ;;
  *)
    echo "usage: ./dev.sh demo [ARGS] | ./dev.sh test [PYTEST ARGS] | ./dev.sh bundle [--no-model] [--force] | ./dev.sh lint" >&2
    exit 2
    ;;
esac
