#!/usr/bin/env bash
# libbrisk.so needs only libc (no libstdc++: a preloaded C program loads nothing more) and
# exports only the allocator: the malloc family (with glibc's __libc_* names for it), operator
# new/delete, brisk_*, pthread_join and thrd_join (override/threads.cc parks the joining thread's
# heap).
#   library_symbols.sh path/to/libbrisk.so
set -euo pipefail
lib=$1
fail=0
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $needed"
for n in $needed; do
  case "$n" in
    libc.so.*|ld-linux*) ;;
    *) echo "FAIL: libbrisk.so needs $n" >&2; fail=1 ;;
  esac
done
allowed='^(malloc|free|cfree|calloc|realloc|reallocarray|aligned_alloc|memalign|posix_memalign|valloc|pvalloc|malloc_usable_size|malloc_trim|mallinfo2?|malloc_stats|malloc_info|free_sized|free_aligned_sized|__libc_(malloc|free|calloc|realloc|memalign|valloc|pvalloc)|_Znwm|_Znam|_Znwm(RKSt9nothrow_t|St11align_val_t|St11align_val_tRKSt9nothrow_t)|_Znam(RKSt9nothrow_t|St11align_val_t|St11align_val_tRKSt9nothrow_t)|_Zd[la]Pv(m|RKSt9nothrow_t|St11align_val_t|St11align_val_tRKSt9nothrow_t|mSt11align_val_t)?|brisk_[a-z_]+|pthread_join|thrd_join)$'
exported=$(nm -D --defined-only "$lib" | awk '{print $3}')
count=$(wc -w <<<"$exported")
echo "exported: $count symbols"
for s in $exported; do
  [[ "$s" =~ $allowed ]] || { echo "FAIL: libbrisk.so exports $s" >&2; fail=1; }
done
for s in malloc free _Znwm _ZdlPv brisk_malloc; do
  grep -qx "$s" <<<"$exported" || { echo "FAIL: libbrisk.so does not export $s" >&2; fail=1; }
done
[ "$fail" -eq 0 ] && echo "library_symbols: ok"
exit "$fail"
