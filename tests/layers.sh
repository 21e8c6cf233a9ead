#!/usr/bin/env bash
# The layer rule: each folder of the allocator includes only the folders below it,
#   core <- threadcache <- debug <- override
# (include/brisk, the public headers, may be included from anywhere). Fails on any include that
# runs up a layer, or on an allocator source outside these folders.
#   layers.sh SOURCE_DIR
set -euo pipefail
cd "$1"
layers=(core threadcache debug override)
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
fail=0 checked=0
for dir in "${layers[@]}"; do
  [ -d "$dir" ] || continue
  mine=$(rank "$dir")
  while IFS= read -r file; do
    checked=$((checked + 1))
    while IFS= read -r inc; do
      target=${inc%%/*}
      r=$(rank "$target")
      [ "$r" -lt 0 ] && continue   # not a layer folder (e.g. brisk/ public headers)
      if [ "$r" -gt "$mine" ]; then
        echo "FAIL: $file includes \"$inc\": $dir must not include $target (order: ${layers[*]})" >&2
        fail=1
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
  done < <(find "$dir" -name '*.h' -o -name '*.cc' | sort)
done
echo "layers: $checked files checked"
[ "$checked" -gt 0 ] || { echo "FAIL: no allocator sources found under $PWD" >&2; exit 1; }
exit "$fail"
