/* brisk: a thread-caching memory allocator for multithreaded servers.
 *
 * The C API. Every function here is safe to call from any thread, before main and after the
 * calling thread's cache is gone. Failure outcomes (the README's "Bad input" table):
 *   - brisk_malloc / brisk_calloc / brisk_realloc / brisk_aligned_alloc return NULL with
 *     errno = ENOMEM when the size cannot be served (size > PTRDIFF_MAX, calloc overflow);
 *     brisk_realloc leaves the old block intact on failure.
 *   - brisk_aligned_alloc returns NULL with errno = EINVAL when alignment is not a power of two.
 *   - brisk_free of a pointer brisk never handed out, of a pointer into the middle of a block,
 *     or of a block that is already free, prints one line naming the pointer to stderr and
 *     aborts. A second free of a block that has not been handed out again is caught, whether
 *     the two frees come one after the other from any threads or at once from two threads
 *     other than the one whose cache holds the block's span (a free by that thread racing with
 *     a free by another thread is not guaranteed to be caught). A second free after the memory was
 *     handed out again frees the new block: nothing short of a quarantine can see it.
 */
#ifndef BRISK_BRISK_H
#define BRISK_BRISK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRISK_VERSION_MAJOR 0
#define BRISK_VERSION_MINOR 1
#define BRISK_VERSION_PATCH 0

void* brisk_malloc(size_t size);
void* brisk_calloc(size_t count, size_t size);
void* brisk_realloc(void* ptr, size_t size);
void brisk_free(void* ptr);
/* Frees a block whose requested size (or any size up to its usable size) is known. */
void brisk_free_sized(void* ptr, size_t size);
/* alignment: any power of two (C11 aligned_alloc's size-multiple rule is not enforced). */
void* brisk_aligned_alloc(size_t alignment, size_t size);
/* Bytes that may be used at ptr; >= the size requested. 0 for NULL. */
size_t brisk_usable_size(const void* ptr);

/* Returns this thread's cached free memory (its debug heap's too) to the central pools and the OS. */
void brisk_thread_collect(void);

/* Returns every free page of the process to the OS now: this thread's caches (as
 * brisk_thread_collect), the free pages of every chunk (other threads' and exited threads'),
 * the orphan queue, the spans emptied by frees queued to other threads, the empty-chunk cache
 * and the large-block cache. Debug mode's quarantine empties first: each freed debug block in it
 * is checked (damage is reported) and its memory freed, as when newer frees push it out, so a
 * write after free into it is no longer seen. Whole pages of free blocks between live blocks go
 * back too, in this thread's spans and exited threads' (a second free of a block there is still
 * reported as a double free), and so do the pages past what those spans have carved into blocks
 * that held earlier data. Live blocks, free blocks in the spans of other running threads that
 * still hold a live block, and other threads' cached spans stay. Returns the bytes decommitted
 * (madvise) or unmapped: 0 means nothing was given back. Safe while other threads allocate and
 * free. malloc_trim calls it when brisk replaces malloc. */
size_t brisk_trim(void);

/* The speed-versus-memory strategy (the README's "Strategy" section has the table of what each
 * moves). Balanced is the default; BRISK_STRATEGY=speed|balanced|low-memory sets it at start.
 * brisk_set_strategy may be called at any time from any thread: each thread follows at its next
 * refill, free batch or purge check, without stopping. A lever set in the environment
 * (BRISK_PURGE_DELAY_MS=...) keeps its value under every strategy. Returns 0, or -1 with
 * errno = EINVAL for a value that is not one of the three. */
typedef enum brisk_strategy {
  BRISK_STRATEGY_SPEED = 0,      /* keeps memory for reuse: fewer page faults and system calls */
  BRISK_STRATEGY_BALANCED = 1,   /* returns memory unused for a short while; the default */
  BRISK_STRATEGY_LOW_MEMORY = 2  /* returns memory as soon as it is free, keeps small caches */
} brisk_strategy;
int brisk_set_strategy(brisk_strategy strategy);
brisk_strategy brisk_get_strategy(void);

/* Statistics (the README's "Statistics" lists every field).
 *
 * Process-wide counters, for tests, the stress suite and operators. Nothing is counted on the
 * allocation fast paths: the block counts are derived, when asked, from the span descriptors
 * of every chunk (a walk under the chunk registry's lock, proportional to the mapped chunks),
 * the large cache's resident pages with mincore, and the rest are counters kept on slow paths.
 * While other threads run, each number is read on its own, so sums of them can be off by what
 * changed meanwhile. When no thread allocates or frees meanwhile, every field is exact except
 * bytes_resident (an estimate, see there), and large_cache_resident_bytes and
 * process_rss_bytes (the kernel's figures). All byte counts are bytes. */
typedef struct brisk_stats {
  uint64_t chunks_mapped;       /* 4 MiB chunks currently mapped for small and medium blocks */
  uint64_t chunk_bytes_mapped;  /* bytes of those chunks */
  uint64_t large_bytes_mapped;  /* bytes mapped for large blocks, live or cached */
  uint64_t large_bytes_cached;  /* of which held in the large-block cache */
  uint64_t large_live_blocks;   /* large blocks currently handed out */
  uint64_t os_map_calls;        /* mmap calls made so far */
  uint64_t os_unmap_calls;      /* munmap calls made so far */
  uint64_t os_decommit_calls;   /* madvise calls that returned memory to the OS */
  uint64_t heaps_live;          /* thread heaps attached to a running thread */
  uint64_t heaps_total;         /* thread heaps ever created (they are recycled) */
  uint64_t spans_orphaned;      /* spans held by the central pools without an owner */
  uint64_t chunk_bytes_cached;  /* of chunk_bytes_mapped, empty chunks kept decommitted for reuse */
  /* Appended for issue 10; the fields above keep their offsets. */
  uint64_t bytes_in_use;         /* live blocks by usable size: small + medium + large, less
                                    remote_queued_bytes (freed, on their way to their span) */
  uint64_t small_bytes_in_use;   /* small blocks handed out and not yet back in their span */
  uint64_t medium_bytes_in_use;  /* the same for medium blocks, by usable size (the request
                                    rounded up to 16 bytes; their pages count as resident) */
  uint64_t large_bytes_in_use;   /* usable bytes of live large blocks */
  uint64_t small_live_blocks;
  uint64_t medium_live_blocks;
  uint64_t thread_cache_bytes;   /* free blocks in spans owned by thread heaps: free lists,
                                    uncarved room, retained empty spans */
  uint64_t central_pool_bytes;   /* free blocks in spans of exited threads (central pools) */
  uint64_t remote_queued_bytes;  /* blocks freed by a thread that does not own their span, in its
                                    outgoing batches, its foreign cache (kept for its own next
                                    allocations) or in a remote-free queue */
  uint64_t large_cache_resident_bytes; /* of large_bytes_cached, the pages resident at the read
                                    (mincore over the parts freed blocks may have written;
                                    a thread's stashed mapping counts whole) */
  uint64_t chunk_bytes_free;     /* free 64 KiB pages of live chunks (no span holds them) */
  uint64_t chunk_bytes_free_resident; /* of which used since last purged: still resident */
  uint64_t bytes_mapped;         /* chunk_bytes_mapped + large_bytes_mapped */
  uint64_t bytes_resident;       /* estimate: chunk headers, carved pages of small spans and
                                    the pages past them that held data when claimed, whole
                                    medium spans, chunk_bytes_free_resident, live large mappings
                                    whole, large_cache_resident_bytes. An upper bound of brisk's
                                    share of process_rss_bytes, less what the kernel reclaimed */
  uint64_t process_rss_bytes;    /* resident memory of the whole process (/proc/self/statm) */
  uint64_t kept_span_bytes;      /* of central_pool_bytes' spans, the emptied ones kept whole for
                                    their class's next span: the bytes their blocks may have
                                    written, in whole OS pages, so up to a page a span more than
                                    their blocks (BRISK_KEPT_SPAN_BYTES bounds it) */
  /* How carving makes a fresh OS page present (README "Memory layout"): madvise
   * (MADV_POPULATE_WRITE) calls so far, and what each way has cost in this process, a moving
   * average in nanoseconds a page (0: not measured yet). The cheaper way is taken. */
  uint64_t os_populate_calls;
  uint64_t page_fault_ns;
  uint64_t page_populate_ns;
} brisk_stats;

/* Fills the first min(size, sizeof(brisk_stats)) bytes of *out (size: the caller's
 * sizeof(brisk_stats)) and returns the library's sizeof(brisk_stats). brisk_stats only grows,
 * at its end: a program built against this brisk.h or a later one gets from any library the
 * fields both know, nothing written past its struct, and from the size returned which fields
 * an older library left as they were. brisk_get_stats(out) is a macro that passes the
 * sizeof(brisk_stats) of the header it was compiled with; call it unqualified (not as
 * ::brisk_get_stats in C++). */
size_t brisk_get_stats_sized(brisk_stats* out, size_t size);
/* The function itself ((brisk_get_stats)(out), a pointer to it, dlsym) writes the 28 fields
 * above, up to kept_span_bytes, for programs built before brisk_get_stats_sized existed (a
 * header older than the field kept_span_bytes had 27: no release of brisk had such a header);
 * a field appended to brisk_stats is written only through brisk_get_stats_sized. */
void brisk_get_stats(brisk_stats* out);
#define brisk_get_stats(out) ((void)brisk_get_stats_sized((out), sizeof(brisk_stats)))

/* Per size class (small blocks, up to 64 KiB). */
#define BRISK_SIZE_CLASSES 80
typedef struct brisk_class_stats {
  uint64_t block_size;
  uint64_t live_blocks;  /* handed out and not yet back in their span (remote frees on the way
                            included) */
  uint64_t free_blocks;  /* room for more in the class's spans held by thread heaps and central
                            pools: free lists, uncarved blocks, empty retained spans */
  uint64_t spans;        /* spans of the class, owned by a heap or a central pool */
} brisk_class_stats;
/* Fills out[0 .. min(max, BRISK_SIZE_CLASSES)) in class order; returns BRISK_SIZE_CLASSES. */
size_t brisk_get_class_stats(brisk_class_stats* out, size_t max);

/* Per thread that owns a heap now (a thread gets one at its first allocation and gives it up at
 * exit). Counts start when the thread gets its heap. */
typedef struct brisk_thread_stats {
  uint64_t heap_id;               /* brisk's number for the heap (heaps are recycled) */
  uint64_t thread_id;             /* the OS thread id (gettid) */
  uint64_t cache_bytes;           /* free blocks in the spans its heap owns */
  uint64_t remote_frees_sent;     /* blocks it freed that other threads' heaps own */
  uint64_t remote_frees_received; /* blocks of its heap other threads freed, taken back so far */
} brisk_thread_stats;
/* Fills out[0 .. min(max, n)) and returns n, the number of threads with a heap (an entry of a
 * thread that exited during the call is all zero). */
size_t brisk_get_thread_stats(brisk_thread_stats* out, size_t max);

/* Per central structure: how often its lock was taken and how often a thread found it held
 * (the README's "Scaling on paper" says which path takes which). Counted since the process
 * started, on slow paths only; the allocation fast paths take no lock. Entries, in this order:
 * "central pools" (the small size classes' pools, summed), "medium pool", "chunk registry",
 * "chunk cache", "abandoned chunks", "large cache", "heap pool" (heaps of exited threads),
 * "heap slow locks" (every thread heap's own lock, summed), "background pass", and
 * "orphan queue", which is lock-free: acquisitions counts its operations (chains pushed,
 * non-empty takes) and contended its compare-and-swaps that lost a race. */
typedef struct brisk_lock_stats {
  const char* name;       /* a static string */
  uint64_t acquisitions;  /* times the lock was taken */
  uint64_t contended;     /* of which it was held by another thread and had to wait */
  uint64_t yields;        /* sched_yield calls made while waiting */
} brisk_lock_stats;
#define BRISK_LOCK_STRUCTURES 10
/* Fills out[0 .. min(max, BRISK_LOCK_STRUCTURES)) and returns BRISK_LOCK_STRUCTURES. Takes no
 * lock; each counter is read on its own. */
size_t brisk_get_lock_stats(brisk_lock_stats* out, size_t max);

/* Writes the statistics above to `out`, as a table (json = 0) or as one JSON object (json != 0:
 * {"stats": {field: number, ...}, "classes": [...], "threads": [...], "locks": {name: {...}}}, classes
 * and threads with nothing in them left out). Calls no malloc: it formats into a buffer on the stack and writes
 * it to fileno(out) after fflush(out) (a stream without a descriptor gets fwrite), so it is
 * safe at exit and in a damaged heap. BRISK_STATS=1 (table) or 2 (JSON) prints it to stderr at
 * exit. */
void brisk_print_stats(FILE* out, int json);

/* Debug mode (the README's "Debug mode"): from the next allocation of every thread on, blocks
 * carry a header, guard bytes, a canary after the data and fill patterns, and freed blocks wait
 * in a quarantine; misuse is reported (and aborts, unless BRISK_DEBUG_ACTION=report). Enter and
 * exit nest: the mode is on while enters outnumber exits. BRISK_DEBUG=1 enters at start-up.
 * Blocks made in either mode may be freed or reallocated in the other. */
void brisk_debug_enter(void);
void brisk_debug_exit(void);
int brisk_debug_active(void);
/* Checks every live and quarantined debug block; reports each damaged one and returns their
 * number. Called from a report callback of a check under way on the same thread, it checks
 * nothing and returns -1. */
int brisk_check_heap(void);
/* Sends each report to callback(text, length, context) instead of BRISK_DEBUG_LOG or stderr;
 * NULL restores those. A report already under way on another thread may still call the
 * callback this replaces, with its context, after this returns: keep that context valid (a
 * static object, say) for as long as reports may be made. The callback should return: it is
 * called outside brisk's locks. */
void brisk_debug_set_report_callback(void (*callback)(const char* text, size_t length, void* context),
                                     void* context);

#ifdef __cplusplus
}
#endif

#endif /* BRISK_BRISK_H */
