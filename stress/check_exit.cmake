# Runs a command and checks its exit code and stderr; used by stress/CMakeLists.txt's tests.
#   -DRUN=program            the program to run
#   -DARGS=a,b,c             its arguments, separated by commas
#   -DEXPECT_EXIT=N          the exit code it must return
#   -DEXPECT_STDERR=regex    optional: stderr must match
#   -DEXPECT_ONE_LINE=1      optional: stderr must be exactly one line
#   -DEXPECT_STDOUT=regex    optional: stdout must match
#   -DREJECT_STDOUT=regex    optional: stdout must not match
#   -DPRELOAD=lib.so         optional: run with LD_PRELOAD=lib.so
#   -DDAMAGE=mode            optional: run with BRISK_BROKEN_ALLOC=mode (broken_alloc_shim.c)
string(REPLACE "," ";" args "${ARGS}")
if(PRELOAD)
  set(ENV{LD_PRELOAD} "${PRELOAD}")
endif()
if(DAMAGE)
  set(ENV{BRISK_BROKEN_ALLOC} "${DAMAGE}")
endif()
execute_process(COMMAND ${RUN} ${args} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
unset(ENV{LD_PRELOAD})
message("${RUN} ${args}\nexit code: ${code}\n--- stdout ---\n${out}--- stderr ---\n${err}")
if(NOT "${code}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT}, got '${code}'")
endif()
if(DEFINED EXPECT_STDERR AND NOT err MATCHES "${EXPECT_STDERR}")
  message(FATAL_ERROR "stderr does not match '${EXPECT_STDERR}'")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  message(FATAL_ERROR "stdout does not match '${EXPECT_STDOUT}'")
endif()
if(DEFINED REJECT_STDOUT AND out MATCHES "${REJECT_STDOUT}")
  message(FATAL_ERROR "stdout matches '${REJECT_STDOUT}'")
endif()
if(EXPECT_ONE_LINE)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines count)
  if(NOT count EQUAL 1 OR NOT err MATCHES "\n$")
    message(FATAL_ERROR "stderr is not exactly one line")
  endif()
endif()
