#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs the two examples the README
# shows against that prefix: examples/link-cmake (find_package(brisk) + brisk::brisk) and
# examples/link-pkgconfig (pkg-config --cflags --libs brisk).
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d "${TMPDIR:-/tmp}/brisk-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
lib=$(find "$prefix" -name 'libbrisk.so' | head -1)
[ -n "$lib" ] || { echo "FAIL: no libbrisk.so installed under $prefix" >&2; find "$prefix" >&2; exit 1; }
libdir=$(dirname "$lib")
for f in "$libdir/libbrisk.a" "$prefix/include/brisk/brisk.h" "$prefix/include/brisk/brisk.hpp" \
         "$libdir/cmake/brisk/briskConfig.cmake" "$libdir/pkgconfig/brisk.pc"; do
  [ -f "$f" ] || { echo "FAIL: $f was not installed" >&2; exit 1; }
done
cp -r "$src/examples" "$work/examples"

check_app() {  # check_app NAME APP: runs the app and checks brisk served it, from the prefix
  local name=$1 app=$2 out
  # As a user runs it: no LD_LIBRARY_PATH (CMake and brisk.pc give the app an rpath).
  out=$(env -u LD_LIBRARY_PATH "$app") || { echo "$out"; echo "FAIL: $name app exited $?" >&2; exit 1; }
  echo "$out"
  grep -q "^served by brisk$" <<<"$out" || { echo "FAIL: $name app not served by brisk" >&2; exit 1; }
  # brisk.pc's rpath is relative to its own location (pkgconfig/../..): compare real paths.
  local from
  from=$(sed -n 's/^malloc comes from //p' <<<"$out")
  [[ "$(basename "$from")" == libbrisk.so* && "$(realpath "$(dirname "$from")")" == "$(realpath "$libdir")" ]] ||
    { echo "FAIL: $name app did not use the installed libbrisk.so in $libdir" >&2; exit 1; }
}

echo "== examples/link-cmake"
cmake -S "$work/examples/link-cmake" -B "$work/build-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/build-cmake" >"$work/cmake-build.log" || { cat "$work/cmake-build.log"; exit 1; }
check_app link-cmake "$work/build-cmake/app"

echo "== examples/link-pkgconfig"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
echo "pkg-config --cflags --libs brisk: $(pkg-config --cflags --libs brisk)"
make -C "$work/examples/link-pkgconfig" >"$work/make.log" 2>&1 || {
  cat "$work/make.log"
  echo "FAIL: building with pkg-config failed (does brisk.pc point into $prefix?)" >&2
  exit 1
}
check_app link-pkgconfig "$work/examples/link-pkgconfig/app"
echo "install test passed"
