#!/usr/bin/env bash
# Builds the IGI Unity plugin's core library and console tests with Mono's mcs (no Unity needed), then runs them.
#   plugins/unity/build.sh [--vectors DIR] [--connection-file F] [--filter S] [--no-run]
# Output: plugins/unity/build/{Igi.Core.dll, Igi.Core.dll.config, Igi.Tests.exe}. Debian: apt-get install mono-mcs mono-runtime
# libnunit-cil-dev libzmq5. The bundle tests (nunit:BundleTests.*) run when IGI_DAEMON_BUNDLE names the daemon bundle folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$here/build"
vectors="$repo/ipc/vectors"
connection_file="${IGI_CONNECTION_FILE:-}"
filter=""
run=1
while [ $# -gt 0 ]; do
  case "$1" in
    --vectors) vectors="$2"; shift 2 ;;
    --connection-file) connection_file="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --no-run) run=0; shift ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v mcs >/dev/null || { echo "build.sh: mcs not found; install the Debian package mono-mcs (and mono-runtime)" >&2; exit 3; }
command -v mono >/dev/null || { echo "build.sh: mono not found; install the Debian package mono-runtime" >&2; exit 3; }
mkdir -p "$out"
flags=(-langversion:7.2 -sdk:4.7.2 -warnaserror+ -debug -optimize+)
mapfile -t core_sources < <(find "$here/Runtime/Core" -name '*.cs' | sort)
mapfile -t unity_sources < <(find "$here/Runtime/Unity" -name '*.cs' | sort)
mapfile -t test_sources < <(find "$here/Tests" -name '*.cs' -not -path '*/UnityShim~/*' | sort)
mcs "${flags[@]}" -target:library -doc:"$out/Igi.Core.xml" -out:"$out/Igi.Core.dll" -r:System.dll "${core_sources[@]}"
# Runtime/Unity compiles to nothing without UnityEngine (#if UNITY_5_3_OR_NEWER); compiling it proves that.
mcs "${flags[@]}" -target:library -out:"$out/Igi.Unity.NoEngine.dll" -r:"$out/Igi.Core.dll" "${unity_sources[@]}"
# Type-check the MonoBehaviours and the samples against a compile-only UnityEngine shim (never run, never shipped).
mapfile -t sample_sources < <(find "$here/Samples~" -name '*.cs' | sort)
mcs "${flags[@]}" -target:library -define:UNITY_5_3_OR_NEWER -define:UNITY_2022_1_OR_NEWER -out:"$out/Igi.Unity.ShimCheck.dll" -r:"$out/Igi.Core.dll" \
  "${unity_sources[@]}" "${sample_sources[@]}" "$here/Tests/UnityShim~/UnityEngineShim.cs"
# ... and as the editor compiles them (UNITY_EDITOR: the script-reload handling, against a UnityEditor shim).
mcs "${flags[@]}" -target:library -define:UNITY_5_3_OR_NEWER -define:UNITY_2022_1_OR_NEWER -define:UNITY_EDITOR -out:"$out/Igi.Unity.EditorShimCheck.dll" \
  -r:"$out/Igi.Core.dll" "${unity_sources[@]}" "${sample_sources[@]}" "$here/Tests/UnityShim~/UnityEngineShim.cs"
# Tests/Runtime holds Unity Test Framework (NUnit) tests; here they compile against Debian's NUnit (libnunit-cil-dev,
# brought by mono-devel) and the console runner runs them (NUnitAdapter).
nunit="${IGI_NUNIT_DLL:-/usr/lib/cli/nunit.framework-2.6.3/nunit.framework.dll}"
[ -f "$nunit" ] || { echo "build.sh: $nunit not found; install the Debian package libnunit-cil-dev (or set IGI_NUNIT_DLL)" >&2; exit 3; }
cp "$nunit" "$out/"
mcs "${flags[@]}" -target:exe -out:"$out/Igi.Tests.exe" -r:"$out/Igi.Core.dll" -r:System.dll -r:"$out/nunit.framework.dll" "${test_sources[@]}"
# Standalone Mono resolves DllImport("libzmq") through this map when only the runtime package (libzmq.so.5) is present.
cat > "$out/Igi.Core.dll.config" <<'XML'
<configuration>
  <dllmap dll="libzmq" os="linux" target="libzmq.so.5"/>
  <dllmap dll="libzmq" os="osx" target="libzmq.5.dylib"/>
</configuration>
XML
echo "built $out/Igi.Core.dll and $out/Igi.Tests.exe"
[ "$run" = 1 ] || exit 0
args=()
[ -n "$vectors" ] && args+=(--vectors "$vectors")
[ -n "$connection_file" ] && args+=(--connection-file "$connection_file")
[ -n "$filter" ] && args+=(--filter "$filter")
cd "$out"
exec mono --debug Igi.Tests.exe "${args[@]}"
