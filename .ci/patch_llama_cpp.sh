#!/usr/bin/env bash
# Apply the project's llama.cpp patch series (patches/llama.cpp/*.patch, in name order) to an extracted
# llama-cpp-python source tree: .ci/patch_llama_cpp.sh SRC   (llama.cpp is SRC/vendor/llama.cpp).
# Idempotent: a patch that is already applied is skipped. Used by ./dev.sh (CPU builds) and by
# ../shared/gpu/build_on_gpu.sh (the CUDA build on the GPU machine). Needs `patch` or `git`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: patch_llama_cpp.sh LLAMA_CPP_PYTHON_SRC}
dst="$src/vendor/llama.cpp"
[ -d "$dst/ggml" ] || { echo "patch_llama_cpp: $dst is not a llama.cpp tree" >&2; exit 1; }
apply() {  # apply [--check] [-R] PATCH
  if command -v patch > /dev/null; then
    local args=(-p1 -d "$dst" --forward --silent)
    [ "$1" = --check ] && { args+=(--dry-run); shift; }
    [ "$1" = -R ] && { args=(-p1 -d "$dst" -R --silent --dry-run); shift; }
    patch "${args[@]}" < "$1" > /dev/null
  else  # outside any repository (vendor/llama.cpp has a submodule .git file that would confuse git)
    local args=(apply -p1 --unsafe-paths "--directory=$dst")
    [ "$1" = --check ] && { args+=(--check); shift; }
    [ "$1" = -R ] && { args+=(-R --check); shift; }
    (cd "$(mktemp -d)" && git "${args[@]}" "$1")
  fi
}
# the patches applied to this tree, by name: a later patch may change lines of an earlier one, which then no longer
# reverses cleanly, so the reverse check alone cannot tell that it is in
stamp="$dst/.igi-llama-cpp-patches"
for p in "$here"/patches/llama.cpp/*.patch; do
  name=$(basename "$p")
  if grep -qxF "$name" "$stamp" 2> /dev/null || apply -R "$p" 2> /dev/null; then
    echo "patch_llama_cpp: $name already applied"
  elif apply --check "$p"; then
    apply "$p"
    echo "$name" >> "$stamp"
    echo "patch_llama_cpp: applied $name"
  else
    echo "patch_llama_cpp: $name does not apply to $dst (see patches/llama.cpp/README.md, 'Rebasing')" >&2
    exit 1
  fi
done
