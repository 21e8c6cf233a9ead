// brisk C++ API: brisk::allocator<T>, a standard-conforming allocator over brisk_malloc; the
// strategy switch; and debug_scope, which keeps debug mode on for its lifetime.
#ifndef BRISK_BRISK_HPP
#define BRISK_BRISK_HPP

#include <brisk/brisk.h>

#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>

namespace brisk {

template <class T>
class allocator {
 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using propagate_on_container_move_assignment = std::true_type;
  using is_always_equal = std::true_type;

  constexpr allocator() noexcept = default;
  template <class U>
  constexpr allocator(const allocator<U>&) noexcept {}

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    void* p = (alignof(T) > alignof(std::max_align_t))
                  ? brisk_aligned_alloc(alignof(T), n * sizeof(T))
                  : brisk_malloc(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept { brisk_free_sized(p, n * sizeof(T)); }

  template <class U>
  friend constexpr bool operator==(const allocator&, const allocator<U>&) noexcept {
    return true;
  }
};

enum class strategy : int {
  speed = BRISK_STRATEGY_SPEED,
  balanced = BRISK_STRATEGY_BALANCED,
  low_memory = BRISK_STRATEGY_LOW_MEMORY,
};
inline void set_strategy(strategy s) noexcept { brisk_set_strategy(static_cast<brisk_strategy>(s)); }
inline strategy get_strategy() noexcept { return static_cast<strategy>(brisk_get_strategy()); }

// Debug mode on from construction to destruction (brisk_debug_enter/exit: scopes nest).
class debug_scope {
 public:
  debug_scope() noexcept { brisk_debug_enter(); }
  ~debug_scope() { brisk_debug_exit(); }
  debug_scope(const debug_scope&) = delete;
  debug_scope& operator=(const debug_scope&) = delete;
};

}  // namespace brisk

#endif  // BRISK_BRISK_HPP
