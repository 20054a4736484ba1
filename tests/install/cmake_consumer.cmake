# cmake -DSOURCE_DIR=consumer -DBINARY_DIR=... -DPREFIX=... -DKIND=shared|static -DGENERATOR=...
#       -DC_COMPILER=... -DREADELF=... -P cmake_consumer.cmake
# Configures the consumer project against the install tree in PREFIX with find_package(moekit), builds it, checks
# that it found the package there and linked the kind asked for (libmoekit.so NEEDED or not), and runs it.
include("${CMAKE_CURRENT_LIST_DIR}/install_util.cmake")

if(KIND STREQUAL "shared")
  set(LINK_TARGET moekit::moekit)
else()
  set(LINK_TARGET moekit::moekit_static)
endif()

file(REMOVE_RECURSE "${BINARY_DIR}")
run_checked("configure the consumer (${LINK_TARGET})"
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
          "-DCMAKE_C_COMPILER=${C_COMPILER}" -DCMAKE_BUILD_TYPE=Release
          "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DMOEKIT_TARGET=${LINK_TARGET}")

file(STRINGS "${BINARY_DIR}/CMakeCache.txt" moekit_dir REGEX "^moekit_DIR:")
string(FIND "${moekit_dir}" "${PREFIX}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "find_package(moekit) did not find the install tree in ${PREFIX}: ${moekit_dir}")
endif()

run_checked("build the consumer" COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
expect_linkage("${BINARY_DIR}/consumer" "${READELF}" "${KIND}")
run_checked("run the consumer" COMMAND "${BINARY_DIR}/consumer" OUTPUT_VARIABLE output)
message(STATUS "${output}")
