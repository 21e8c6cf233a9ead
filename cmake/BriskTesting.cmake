# One helper per kind of test, so every test is registered with ctest the same way.
#   brisk_add_unit_test(NAME SOURCES a.cc b.cc [LIBS x y])   GoogleTest, label "unit".
#       Links brisk::core (the non-override library) unless LIBS names another.
#       Runs under sanitizer builds too.
#   brisk_add_override_test(NAME COMMAND cmd args... [ENVIRONMENT K=V...])  label "override".
#       Not registered in sanitizer builds.
#   brisk_add_stress_smoke(NAME COMMAND cmd args... [ENVIRONMENT K=V...])   label "stress".
#       Not registered in sanitizer builds.
# FAIL_REGULAR_EXPRESSION of a ctest entry that runs one gtest test under the environment it
# needs, and skips without: gtest's marks of a skipped test and of a filter that matched nothing,
# so that a renamed variable or test cannot leave the entry passing with nothing run.
set(BRISK_MUST_RUN "SKIPPED;Running 0 tests")

function(brisk_add_unit_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  if(NOT A_LIBS)
    set(A_LIBS brisk::core)
  endif()
  find_package(GTest REQUIRED)
  target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME ${name} COMMAND ${name})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT ${A_TIMEOUT})
endfunction()

function(_brisk_add_command_test label name)
  cmake_parse_arguments(A "" "TIMEOUT;WILL_FAIL" "COMMAND;ENVIRONMENT" ${ARGN})
  if(BRISK_SANITIZE)
    return()
  endif()
  add_test(NAME ${name} COMMAND ${A_COMMAND})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS ${label} TIMEOUT ${A_TIMEOUT})
  if(A_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${A_ENVIRONMENT}")
  endif()
  if(A_WILL_FAIL)
    set_tests_properties(${name} PROPERTIES WILL_FAIL ${A_WILL_FAIL})
  endif()
endfunction()

function(brisk_add_override_test name)
  _brisk_add_command_test(override ${name} ${ARGN})
endfunction()

function(brisk_add_stress_smoke name)
  _brisk_add_command_test(stress ${name} ${ARGN})
endfunction()

# brisk_add_glibc_port(NAME SOURCE file.cc [TIMEOUT s])  label "glibc".
#   A port of one of glibc's malloc tests, built without brisk and registered twice:
#   NAME_brisk with LD_PRELOAD=libbrisk.so, and NAME_glibc without it as the control showing
#   that what the port expects is glibc's behaviour. PORT_ALLOCATOR tells the program which
#   allocator must be serving malloc (tests/glibc/port.h checks it). Exit code 77 is a skip.
#   Not registered in sanitizer builds.
function(brisk_add_glibc_port name)
  cmake_parse_arguments(A "" "SOURCE;TIMEOUT" "" ${ARGN})
  if(BRISK_SANITIZE)
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${name} ${A_SOURCE})
  target_compile_options(${name} PRIVATE -fno-builtin -Wall -Wextra -Wno-alloc-size-larger-than
    -Wno-use-after-free)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
  add_dependencies(${name} brisk_shared)
  foreach(allocator brisk glibc)
    set(env PORT_ALLOCATOR=${allocator})
    if(allocator STREQUAL "brisk")
      list(APPEND env LD_PRELOAD=$<TARGET_FILE:brisk_shared>)
    endif()
    add_test(NAME ${name}_${allocator} COMMAND ${name})
    set_tests_properties(${name}_${allocator} PROPERTIES LABELS glibc TIMEOUT ${A_TIMEOUT}
      ENVIRONMENT "${env}" SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
