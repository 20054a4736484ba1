# Runs moekit-bench on a malformed config and passes when it exits 2 and its message contains EXPECTED.
#   cmake -DBENCH=... -DCONFIG=... -DEXPECTED=... -P expect_config_error.cmake
execute_process(COMMAND "${BENCH}" "${CONFIG}" --backend reference
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit code ${status}; stderr:\n${err}")
if(NOT status EQUAL 2)
  message(FATAL_ERROR "expected exit code 2, got ${status}")
endif()
string(FIND "${err}" "${EXPECTED}" position)
if(position EQUAL -1)
  message(FATAL_ERROR "the message does not contain: ${EXPECTED}")
endif()
