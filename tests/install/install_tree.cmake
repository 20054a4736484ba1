# cmake -DBUILD_DIR=... -DPREFIX=... -DLIBDIR=lib -DINCLUDEDIR=include -DVERSION=0.2.0 -DSOVERSION=0.2
#       -P install_tree.cmake
# Installs the build tree into a fresh PREFIX (what the consumer tests then build against) and checks the layout:
# the header, libmoekit.so{,.SOVERSION,.VERSION}, libmoekit_static.a, the CMake package and the pkg-config files;
# and that the package's version file is SameMajorVersion: any 0.x request accepts 0.y >= x, a 1.x request fails.
include("${CMAKE_CURRENT_LIST_DIR}/install_util.cmake")

file(REMOVE_RECURSE "${PREFIX}")
run_checked("cmake --install" COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}")

set(expected_files
  "${INCLUDEDIR}/moekit/moekit.h"
  "${LIBDIR}/libmoekit.so"
  "${LIBDIR}/libmoekit.so.${SOVERSION}"
  "${LIBDIR}/libmoekit.so.${VERSION}"
  "${LIBDIR}/libmoekit_static.a"
  "${LIBDIR}/cmake/moekit/moekitConfig.cmake"
  "${LIBDIR}/cmake/moekit/moekitConfigVersion.cmake"
  "${LIBDIR}/cmake/moekit/moekitTargets.cmake"
  "${LIBDIR}/pkgconfig/moekit.pc"
  "${LIBDIR}/pkgconfig/moekit_static.pc")
foreach(file IN LISTS expected_files)
  if(NOT EXISTS "${PREFIX}/${file}")
    message(FATAL_ERROR "the install tree lacks ${file}")
  endif()
endforeach()

# What find_package(moekit <requested>) decides, by running the version file as find_package does.
function(accepts requested out)
  set(PACKAGE_FIND_VERSION "${requested}")
  string(REPLACE "." ";" parts "${requested}")
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  include("${PREFIX}/${LIBDIR}/cmake/moekit/moekitConfigVersion.cmake")
  set(${out} "${PACKAGE_VERSION_COMPATIBLE}" PARENT_SCOPE)
endfunction()
string(REGEX MATCH "^[0-9]+" major "${VERSION}")
math(EXPR next_major "${major} + 1")
foreach(case IN ITEMS "${major}.0:TRUE" "${VERSION}:TRUE" "${next_major}.0:FALSE")
  string(REPLACE ":" ";" case "${case}")
  list(GET case 0 requested)
  list(GET case 1 expected)
  accepts("${requested}" compatible)
  if(NOT compatible STREQUAL expected)
    message(FATAL_ERROR "find_package(moekit ${requested}) against ${VERSION}: compatible = '${compatible}', "
                        "expected ${expected} (SameMajorVersion)")
  endif()
endforeach()
message(STATUS "install tree complete in ${PREFIX}")
