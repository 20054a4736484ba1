# cmake -DSANITIZE=address,undefined|thread -DSOURCE_DIR=<repo> -DBINARY_DIR=<dir> -DGENERATOR=<gen>
#       -DC_COMPILER=<cc> -DCXX_COMPILER=<c++> [-DCATCH2_DIR=<dir>] [-DJOBS=2] [-DTEST_SPEC=<spec>|<spec>...]
#       -P sanitize_build.cmake
# Configures a MOEKIT_SANITIZE=<SANITIZE> build of the repository in BINARY_DIR (reference backend only, no
# bench, no examples), builds moekit_cpu_tests in it and runs it (with the Catch2 test specs TEST_SPEC, one
# argument each, separated by "|" - Catch2 ANDs them -, or every test case).
# Fails on a failed step or on any sanitizer report: ASan/UBSan/TSan are set to stop the program on the first
# finding, and the output is also searched for a report in case a finding did not reach the exit status.
# BINARY_DIR is kept, so a re-run rebuilds only what changed.
foreach(var SANITIZE SOURCE_DIR BINARY_DIR GENERATOR C_COMPILER CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "sanitize_build.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED JOBS)
  set(JOBS 2)
endif()

function(step what)
  string(TIMESTAMP t0 "%s")
  execute_process(${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP t1 "%s")
  math(EXPR secs "${t1} - ${t0}")
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "sanitize ${SANITIZE}: ${what} failed (${rc}) after ${secs} s")
  endif()
  message(STATUS "sanitize ${SANITIZE}: ${what}: ${secs} s")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(cache_args)
if(DEFINED CATCH2_DIR AND NOT CATCH2_DIR STREQUAL "")
  list(APPEND cache_args "-DCatch2_DIR=${CATCH2_DIR}")
endif()
# RelWithDebInfo: optimised like the usual build (-O2), with file:line in the reports.
step("configure"
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
          "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
          -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DMOEKIT_SANITIZE=${SANITIZE}" -DMOEKIT_CUDA=OFF
          -DMOEKIT_BUILD_BENCH=OFF -DMOEKIT_BUILD_EXAMPLES=OFF ${cache_args})
step("build moekit_cpu_tests"
  COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --target moekit_cpu_tests -j ${JOBS})

set(ENV{ASAN_OPTIONS} "detect_leaks=1:abort_on_error=1")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")
set(ENV{TSAN_OPTIONS} "halt_on_error=1")
set(run_args)
if(DEFINED TEST_SPEC AND NOT TEST_SPEC STREQUAL "")
  string(REPLACE "|" ";" run_args "${TEST_SPEC}")
endif()
set(exe "${BINARY_DIR}/tests/moekit_cpu_tests")
# NOTE: gcc's TSan cannot map its shadow memory under a kernel's high mmap randomisation ("unexpected memory
# mapping"); without address-space randomisation (setarch -R, where the tool exists) it runs on any kernel.
set(launcher)
find_program(SETARCH setarch)
if(SANITIZE STREQUAL "thread" AND SETARCH)
  cmake_host_system_information(RESULT arch QUERY OS_PLATFORM)
  # Only where the kernel lets it (a container may refuse the personality change).
  execute_process(COMMAND "${SETARCH}" "${arch}" -R true RESULT_VARIABLE setarch_rc OUTPUT_QUIET ERROR_QUIET)
  if(setarch_rc EQUAL 0)
    set(launcher "${SETARCH}" "${arch}" -R)
  endif()
endif()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${launcher} "${exe}" ${run_args} --warn NoTests
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP t1 "%s")
math(EXPR secs "${t1} - ${t0}")
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "sanitize ${SANITIZE}: moekit_cpu_tests failed (${rc}) after ${secs} s")
endif()
if(out MATCHES "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer")
  message(FATAL_ERROR "sanitize ${SANITIZE}: moekit_cpu_tests exited 0 but printed a sanitizer report")
endif()
if(NOT run_args)
  set(run_args "(every test case)")
endif()
message(STATUS "sanitize ${SANITIZE}: run moekit_cpu_tests ${run_args}: ${secs} s")
