// brisk_print_stats: the statistics of brisk_get_stats, brisk_get_class_stats and
// brisk_get_thread_stats as a table or as JSON. It may run at exit or inside a damaged heap, so
// it calls no malloc: rows are formatted into a buffer on the stack (core/text_writer.h) and
// written to the stream's descriptor.
#include "override/stats_print.h"

#include <brisk/brisk.h>
#include <errno.h>

#include "core/hints.h"
#include "core/platform.h"
#include "core/text_writer.h"

namespace {

// Every field of brisk_stats, in order. The static_assert below fails when a field is added to
// brisk.h and not here.
#define BRISK_STATS_FIELDS(X)                                                                   \
  X(chunks_mapped) X(chunk_bytes_mapped) X(large_bytes_mapped) X(large_bytes_cached)            \
  X(large_live_blocks) X(os_map_calls) X(os_unmap_calls) X(os_decommit_calls) X(heaps_live)     \
  X(heaps_total) X(spans_orphaned) X(chunk_bytes_cached) X(bytes_in_use) X(small_bytes_in_use)  \
  X(medium_bytes_in_use) X(large_bytes_in_use) X(small_live_blocks) X(medium_live_blocks)       \
  X(thread_cache_bytes) X(central_pool_bytes) X(remote_queued_bytes)                            \
  X(large_cache_resident_bytes) X(chunk_bytes_free) X(chunk_bytes_free_resident) X(bytes_mapped) \
  X(bytes_resident) X(process_rss_bytes) X(kept_span_bytes) X(os_populate_calls) X(page_fault_ns)  \
  X(page_populate_ns)
#define BRISK_COUNT_FIELD(name) +1
static_assert(sizeof(brisk_stats) == sizeof(uint64_t) * (0 BRISK_STATS_FIELDS(BRISK_COUNT_FIELD)),
              "BRISK_STATS_FIELDS lists every field of brisk_stats");

// Formats into a stack buffer and writes it out every few rows (a row is under 200 bytes).
class Printer {
 public:
  explicit Printer(FILE* out) : out_(out), w_(buf_, sizeof buf_) {
    int saved = errno;
    fflush(out_);
    fd_ = fileno(out_);
    errno = saved;
  }
  // To descriptor 2 without stdio's stderr (platform::write_stderr: the kept duplicate once the
  // program has closed it); what the program left in stderr's buffer goes first.
  Printer() : out_(nullptr), fd_(2), w_(buf_, sizeof buf_) {
    int saved = errno;
    fflush(stderr);  // glibc: a no-op on a closed standard stream, which fclose does not free
    errno = saved;
  }
  ~Printer() { flush(); }
  brisk::TextWriter& w() { return w_; }
  void end_row() {
    w_.put('\n');
    if (++rows_ % 16 == 0) flush();
  }
  // v right-aligned in width columns.
  void number(uint64_t v, int width) {
    char digits[24];
    brisk::TextWriter d(digits, sizeof digits);
    d.decimal(v);
    std::size_t n = d.finish();
    for (int i = static_cast<int>(n); i < width; ++i) w_.put(' ');
    w_.text(digits, n);
  }
  // "  (12.3 MiB)" for a byte count of at least 1 KiB.
  void human(uint64_t bytes) {
    static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) return;
    int unit = 0;
    uint64_t scale = 1024;
    while (unit < 3 && bytes >= scale * 1024) scale *= 1024, ++unit;
    uint64_t tenths = (bytes * 10 + scale / 2) / scale;  // bytes < 2^60 in practice: no overflow
    w_.text("  (");
    w_.decimal(tenths / 10);
    w_.put('.');
    w_.decimal(tenths % 10);
    w_.put(' ');
    w_.text(kUnits[unit]);
    w_.put(')');
  }

 private:
  void flush() {
    std::size_t n = w_.finish();
    if (n != 0) {
      if (fd_ == 2) {
        brisk::platform::write_stderr(buf_, n);
      } else if (fd_ >= 0) {
        brisk::platform::write_fd(fd_, buf_, n);
      } else {
        fwrite(buf_, 1, n, out_);  // a stream without a descriptor (fmemopen, open_memstream)
      }
    }
    w_ = brisk::TextWriter(buf_, sizeof buf_);
  }

  FILE* out_;
  int fd_ = -1;
  int rows_ = 0;
  char buf_[8192];
  brisk::TextWriter w_;
};

bool is_byte_count(const char* name) {
  for (const char* p = name; *p != '\0'; ++p)
    if (p[0] == 'b' && p[1] == 'y' && p[2] == 't' && p[3] == 'e' && p[4] == 's') return true;
  return false;
}

constexpr std::size_t kMaxThreadsShown = 128;

void print_table(Printer& p, const brisk_stats& s, const brisk_class_stats* classes,
                 const brisk_thread_stats* threads, std::size_t shown, std::size_t thread_count,
                 const brisk_lock_stats* locks) {
  p.w().text("brisk statistics");
  p.end_row();
#define BRISK_TABLE_FIELD(name)                         \
  p.w().text("  " #name);                               \
  for (std::size_t i = sizeof #name; i < 28; ++i) p.w().put(' '); \
  p.number(s.name, 16);                                 \
  if (is_byte_count(#name)) p.human(s.name);            \
  p.end_row();
  BRISK_STATS_FIELDS(BRISK_TABLE_FIELD)
#undef BRISK_TABLE_FIELD
  p.w().text("size classes with spans");
  p.end_row();
  p.w().text("  class block_size    spans  live_blocks  free_blocks     live_bytes     free_bytes");
  p.end_row();
  for (std::size_t c = 0; c < BRISK_SIZE_CLASSES; ++c) {
    const brisk_class_stats& k = classes[c];
    if (k.spans == 0 && k.live_blocks == 0) continue;
    p.number(c, 7);
    p.number(k.block_size, 11);
    p.number(k.spans, 9);
    p.number(k.live_blocks, 13);
    p.number(k.free_blocks, 13);
    p.number(k.live_blocks * k.block_size, 15);
    p.number(k.free_blocks * k.block_size, 15);
    p.end_row();
  }
  p.w().text("threads with a heap: ");
  p.w().decimal(thread_count);
  if (shown < thread_count) {
    p.w().text(" (the first ");
    p.w().decimal(shown);
    p.w().text(" shown)");
  }
  p.end_row();
  p.w().text("  heap_id  thread_id    cache_bytes  remote_frees_sent  remote_frees_received");
  p.end_row();
  for (std::size_t i = 0; i < shown; ++i) {
    const brisk_thread_stats& t = threads[i];
    p.number(t.heap_id, 9);
    p.number(t.thread_id, 11);
    p.number(t.cache_bytes, 15);
    p.number(t.remote_frees_sent, 19);
    p.number(t.remote_frees_received, 23);
    p.end_row();
  }
  p.w().text("locks (the orphan queue's: operations, lost compare-and-swaps)");
  p.end_row();
  p.w().text("  structure             acquisitions      contended         yields");
  p.end_row();
  for (std::size_t i = 0; i < BRISK_LOCK_STRUCTURES; ++i) {
    const brisk_lock_stats& l = locks[i];
    p.w().text("  ");
    p.w().text(l.name);
    for (std::size_t n = __builtin_strlen(l.name); n < 18; ++n) p.w().put(' ');
    p.number(l.acquisitions, 16);
    p.number(l.contended, 15);
    p.number(l.yields, 15);
    p.end_row();
  }
}

void json_member(Printer& p, const char* name, uint64_t v, bool first) {
  if (!first) p.w().text(", ");
  p.w().put('"');
  p.w().text(name);
  p.w().text("\": ");
  p.w().decimal(v);
}

void print_json(Printer& p, const brisk_stats& s, const brisk_class_stats* classes,
                const brisk_thread_stats* threads, std::size_t shown, std::size_t thread_count,
                const brisk_lock_stats* locks) {
  p.w().text("{\"stats\": {");
  p.end_row();
  bool first = true;
#define BRISK_JSON_FIELD(name)          \
  if (!first) p.w().put(',');           \
  p.w().text("  \"" #name "\": ");      \
  p.w().decimal(s.name);                \
  first = false;                        \
  p.end_row();
  BRISK_STATS_FIELDS(BRISK_JSON_FIELD)
#undef BRISK_JSON_FIELD
  p.w().text("},");
  p.end_row();
  p.w().text("\"classes\": [");
  first = true;
  for (std::size_t c = 0; c < BRISK_SIZE_CLASSES; ++c) {
    const brisk_class_stats& k = classes[c];
    if (k.spans == 0 && k.live_blocks == 0) continue;
    if (!first) p.w().put(',');
    first = false;
    p.end_row();
    p.w().text("  {");
    json_member(p, "class", c, true);
    json_member(p, "block_size", k.block_size, false);
    json_member(p, "spans", k.spans, false);
    json_member(p, "live_blocks", k.live_blocks, false);
    json_member(p, "free_blocks", k.free_blocks, false);
    p.w().put('}');
  }
  p.w().text("],");
  p.end_row();
  p.w().text("\"thread_count\": ");
  p.w().decimal(thread_count);
  p.w().put(',');
  p.end_row();
  p.w().text("\"threads\": [");
  for (std::size_t i = 0; i < shown; ++i) {
    const brisk_thread_stats& t = threads[i];
    if (i != 0) p.w().put(',');
    p.end_row();
    p.w().text("  {");
    json_member(p, "heap_id", t.heap_id, true);
    json_member(p, "thread_id", t.thread_id, false);
    json_member(p, "cache_bytes", t.cache_bytes, false);
    json_member(p, "remote_frees_sent", t.remote_frees_sent, false);
    json_member(p, "remote_frees_received", t.remote_frees_received, false);
    p.w().put('}');
  }
  p.w().text("],");
  p.end_row();
  p.w().text("\"locks\": {");
  for (std::size_t i = 0; i < BRISK_LOCK_STRUCTURES; ++i) {
    const brisk_lock_stats& l = locks[i];
    if (i != 0) p.w().put(',');
    p.end_row();
    p.w().text("  \"");
    p.w().text(l.name);
    p.w().text("\": {");
    json_member(p, "acquisitions", l.acquisitions, true);
    json_member(p, "contended", l.contended, false);
    json_member(p, "yields", l.yields, false);
    p.w().put('}');
  }
  p.w().text("}}");
  p.end_row();
}

// brisk_print_stats' body, for either kind of Printer.
void print_stats(Printer& p, int json) {
  brisk_stats s;
  brisk_get_stats(&s);
  brisk_class_stats classes[BRISK_SIZE_CLASSES];
  brisk_get_class_stats(classes, BRISK_SIZE_CLASSES);
  brisk_thread_stats threads[kMaxThreadsShown];
  std::size_t thread_count = brisk_get_thread_stats(threads, kMaxThreadsShown);
  std::size_t shown = thread_count < kMaxThreadsShown ? thread_count : kMaxThreadsShown;
  brisk_lock_stats locks[BRISK_LOCK_STRUCTURES];
  brisk_get_lock_stats(locks, BRISK_LOCK_STRUCTURES);
  if (json != 0) {
    print_json(p, s, classes, threads, shown, thread_count, locks);
  } else {
    print_table(p, s, classes, threads, shown, thread_count, locks);
  }
}

}  // namespace

extern "C" BRISK_EXPORT void brisk_print_stats(FILE* out, int json) {
  if (out == nullptr) return;
  Printer p(out);
  print_stats(p, json);
}

namespace brisk {

void print_stats_to_stderr(int json) {
  Printer p;
  print_stats(p, json);
}

void print_malloc_info(FILE* out) {
  brisk_stats s;
  brisk_get_stats(&s);
  brisk_class_stats classes[BRISK_SIZE_CLASSES];
  brisk_get_class_stats(classes, BRISK_SIZE_CLASSES);
  uint64_t free_count = 0, free_bytes = 0;
  Printer p(out);
  auto element = [&p](const char* tag, const char* type, const char* first, uint64_t a, const char* second,
                      uint64_t b) {
    p.w().put('<');
    p.w().text(tag);
    if (type != nullptr) {
      p.w().text(" type=\"");
      p.w().text(type);
      p.w().put('"');
    }
    p.w().put(' ');
    p.w().text(first);
    p.w().text("=\"");
    p.w().decimal(a);
    p.w().put('"');
    if (second != nullptr) {
      p.w().put(' ');
      p.w().text(second);
      p.w().text("=\"");
      p.w().decimal(b);
      p.w().put('"');
    }
    p.w().text("/>");
    p.end_row();
  };
  p.w().text("<malloc version=\"1\">");
  p.end_row();
  p.w().text("<heap nr=\"0\">");
  p.end_row();
  p.w().text("<sizes>");
  p.end_row();
  uint64_t from = 1;
  for (std::size_t c = 0; c < BRISK_SIZE_CLASSES; ++c) {
    const brisk_class_stats& k = classes[c];
    if (k.free_blocks != 0) {
      p.w().text("<size from=\"");
      p.w().decimal(from);
      p.w().text("\" to=\"");
      p.w().decimal(k.block_size);
      p.w().text("\" total=\"");
      p.w().decimal(k.free_blocks * k.block_size);
      p.w().text("\" count=\"");
      p.w().decimal(k.free_blocks);
      p.w().text("\"/>");
      p.end_row();
    }
    free_count += k.free_blocks;
    free_bytes += k.free_blocks * k.block_size;
    from = k.block_size + 1;
  }
  p.w().text("</sizes>");
  p.end_row();
  element("total", "fast", "count", 0, "size", 0);
  element("total", "rest", "count", free_count, "size", free_bytes);
  element("system", "current", "size", s.chunk_bytes_mapped, nullptr, 0);
  element("aspace", "total", "size", s.chunk_bytes_mapped, nullptr, 0);
  p.w().text("</heap>");
  p.end_row();
  element("total", "fast", "count", 0, "size", 0);
  element("total", "rest", "count", free_count, "size", free_bytes);
  element("total", "mmap", "count", s.large_live_blocks, "size", s.large_bytes_mapped);
  element("system", "current", "size", s.bytes_mapped, nullptr, 0);
  element("aspace", "total", "size", s.bytes_mapped, nullptr, 0);
  p.w().text("</malloc>");
  p.end_row();
}

}  // namespace brisk
