# cmake -DC_PROGRAM=... -DCXX_PROGRAM=... [-DEXPECTED=layout.txt] -P check_layout.cmake
# The C and the C++ program print the layout of moekit.h's types; they must agree, and match EXPECTED if given.

function(run_program program out)
  execute_process(COMMAND "${program}" OUTPUT_VARIABLE output RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${program} exited with ${status}")
  endif()
  set(${out} "${output}" PARENT_SCOPE)
endfunction()

run_program("${C_PROGRAM}" c_layout)
run_program("${CXX_PROGRAM}" cxx_layout)
if(NOT c_layout STREQUAL cxx_layout)
  message(FATAL_ERROR "C and C++ see different layouts of moekit.h:\n--- C\n${c_layout}\n--- C++\n${cxx_layout}")
endif()

if(EXPECTED)
  file(READ "${EXPECTED}" expected_layout)
  if(NOT c_layout STREQUAL expected_layout)
    message(FATAL_ERROR "the layout of moekit.h changed (an ABI change). If that is intended, update ${EXPECTED} "
                        "with the output of ${C_PROGRAM}.\n--- now\n${c_layout}\n--- committed\n${expected_layout}")
  endif()
endif()
message(STATUS "C and C++ agree on the layout of moekit.h (${EXPECTED})")
