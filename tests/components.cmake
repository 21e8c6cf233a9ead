# Component unit tests of the allocator's internals: each drives one noun through its own
# interface (and the platform layer's fault injection), linking brisk::core.
foreach(t size_class_test span_test chunk_test remote_queue_test central_pool_test large_test platform_test
    free_key_test)
  brisk_add_unit_test(${t} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cc TIMEOUT 300)
  target_compile_definitions(${t} PRIVATE ${BRISK_TEST_DEFINITIONS})
endforeach()
