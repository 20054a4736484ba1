# cmake -DPKG_CONFIG=... -DPREFIX=... -DLIBDIR=lib -DKIND=shared|static -DSOURCE=consumer.c
#       -DOUTPUT=... -DC_COMPILER=... -DREADELF=... -P pkgconfig_consumer.cmake
# Builds the consumer with nothing but the compiler and pkg-config's flags, the way a Makefile would:
#   cc consumer.c $(pkg-config --cflags --libs moekit_static)
#   cc consumer.c $(pkg-config --cflags --libs moekit) -Wl,-rpath,$(pkg-config --variable=libdir moekit)
# then runs it. Only PREFIX's .pc files are visible (PKG_CONFIG_LIBDIR replaces the default search path).
include("${CMAKE_CURRENT_LIST_DIR}/install_util.cmake")

if(KIND STREQUAL "shared")
  set(PACKAGE moekit)
else()
  set(PACKAGE moekit_static)
endif()

set(ENV{PKG_CONFIG_LIBDIR} "${PREFIX}/${LIBDIR}/pkgconfig")
unset(ENV{PKG_CONFIG_PATH})
run_checked("pkg-config ${PACKAGE}" COMMAND "${PKG_CONFIG}" --cflags --libs "${PACKAGE}" OUTPUT_VARIABLE flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
if(KIND STREQUAL "shared")
  run_checked("pkg-config libdir" COMMAND "${PKG_CONFIG}" --variable=libdir moekit OUTPUT_VARIABLE libdir)
  string(STRIP "${libdir}" libdir)
  list(APPEND flags "-Wl,-rpath,${libdir}")
endif()

get_filename_component(output_dir "${OUTPUT}" DIRECTORY)
file(REMOVE_RECURSE "${output_dir}")
file(MAKE_DIRECTORY "${output_dir}")
run_checked("compile and link the consumer (${PACKAGE})"
  COMMAND "${C_COMPILER}" -std=c99 -Wall -Wextra -Werror "${SOURCE}" ${flags} -o "${OUTPUT}")
expect_linkage("${OUTPUT}" "${READELF}" "${KIND}")
run_checked("run the consumer" COMMAND "${OUTPUT}" OUTPUT_VARIABLE output)
message(STATUS "${output}")
