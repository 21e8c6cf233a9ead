# Component unit tests of the allocator's internals: each drives one noun through its own
# interface (and the platform layer's fault injection), linking brisk::core.
foreach(t size_class_test span_test span_tails_test chunk_test remote_queue_test central_pool_test large_test large_realloc_test platform_test
    free_key_test lock_test page_cost_test)
  brisk_add_unit_test(${t} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cc TIMEOUT 300)
  target_compile_definitions(${t} PRIVATE ${BRISK_TEST_DEFINITIONS})
endforeach()
# The large cache's budgets, set small so that a few blocks exceed them.
add_test(NAME large_budget_test COMMAND large_test --gtest_filter=LargeCacheBudget.*)
set_tests_properties(large_budget_test PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "BRISK_LARGE_CACHE_BYTES=48m;BRISK_LARGE_DIRTY_BYTES=20m"
  FAIL_REGULAR_EXPRESSION "${BRISK_MUST_RUN}")
# The cache's promises under random traffic, with those budgets: entries are decommitted and
# unmapped to stay within them.
add_test(NAME large_budget_invariants_test COMMAND large_test --gtest_filter=LargeCacheDecay.RandomTraffic*)
set_tests_properties(large_budget_invariants_test PROPERTIES LABELS unit TIMEOUT 120
  ENVIRONMENT "BRISK_LARGE_CACHE_BYTES=48m;BRISK_LARGE_DIRTY_BYTES=20m" FAIL_REGULAR_EXPRESSION "${BRISK_MUST_RUN}")
# Low-memory's budget of retained spans, set below what the 2-page classes carve together.
add_test(NAME span_retained_budget_test COMMAND span_test --gtest_filter=Span.LowMemoryReleasesTheSpanKeptLongest*)
set_tests_properties(span_retained_budget_test PROPERTIES LABELS unit TIMEOUT 60 ENVIRONMENT "BRISK_RETAINED_BYTES=768k"
  FAIL_REGULAR_EXPRESSION "${BRISK_MUST_RUN}")
# An adopted 2-page span that empties, with no spans retained: it goes back at once.
add_test(NAME central_pool_retained_off_test COMMAND central_pool_test --gtest_filter=*MultiPageSpan*)
set_tests_properties(central_pool_retained_off_test PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "BRISK_RETAINED_SPANS=0" FAIL_REGULAR_EXPRESSION "${BRISK_MUST_RUN}")
# The large stash, which holds only large blocks of up to 2 MiB: with medium blocks up to 256 KiB.
add_test(NAME large_stash_test COMMAND large_test --gtest_filter=LargeStash.*)
set_tests_properties(large_stash_test PROPERTIES LABELS unit TIMEOUT 60 ENVIRONMENT "BRISK_MEDIUM_MAX=256k"
  FAIL_REGULAR_EXPRESSION "${BRISK_MUST_RUN}")
# No background pass: the span keep's test (PastItsSpanKeep...) places each block and span by
# hand, and a pass taking an idle heap's queue meanwhile would move them.
set_tests_properties(central_pool_test PROPERTIES ENVIRONMENT "BRISK_BACKGROUND=0")
