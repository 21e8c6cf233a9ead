// Compiler hints, written once. Use these rather than raw attributes (house style).
#pragma once

#define BRISK_LIKELY(x) __builtin_expect(!!(x), 1)
#define BRISK_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define BRISK_ALWAYS_INLINE inline __attribute__((always_inline))
#define BRISK_NOINLINE __attribute__((noinline))
#define BRISK_COLD __attribute__((cold, noinline))
#define BRISK_EXPORT __attribute__((visibility("default")))
#define BRISK_CACHELINE 64
