# cmake -DLIBRARY=libmoekit.so -DNM=nm -DREADELF=readelf -DHEADER=moekit.h -DEXPECTED=public_symbols.txt
#       -DPROJECT_VERSION=x.y.z [-DDLOPEN_SOURCE=run_dlopen.c] -P check_symbols.cmake
# Checks that the shared library exports exactly the committed list of functions, all named moekit_*, that the
# list is exactly the MOEKIT_API functions of the header, and that the SONAME follows the header's version.

set(errors "")
macro(fail text)
  string(APPEND errors "  ${text}\n")
endmacro()

# Reports the names in list `a` that are not in list `b`, as "<label>: names".
function(report_difference a b label)
  set(only ${${a}})
  list(REMOVE_ITEM only ${${b}})
  if(only)
    list(JOIN only " " text)
    set(errors "${errors}  ${label}: ${text}\n" PARENT_SCOPE)
  endif()
endfunction()

# 1. The library's dynamic exports.
execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
                OUTPUT_VARIABLE nm_output RESULT_VARIABLE nm_status ERROR_VARIABLE nm_error)
if(NOT nm_status EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed: ${nm_error}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_output}")
set(exported "")
foreach(line IN LISTS nm_lines)
  if(line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^ @]+)")
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(NOT name MATCHES "^moekit_")
      fail("exported symbol without the moekit_ prefix: ${name} (type ${type})")
    elseif(NOT type STREQUAL "T")
      fail("exported symbol that is not a function: ${name} (type ${type})")
    endif()
    list(APPEND exported "${name}")
  endif()
endforeach()
list(SORT exported)

# 2. The committed list.
file(STRINGS "${EXPECTED}" expected REGEX "^moekit_")
list(SORT expected)

# 3. The header's MOEKIT_API functions.
file(READ "${HEADER}" header_text)
string(REGEX MATCHALL "MOEKIT_API[^;(]*[ *]moekit_[a-z0-9_]+\\(" declarations "${header_text}")
set(declared "")
foreach(declaration IN LISTS declarations)
  string(REGEX MATCH "moekit_[a-z0-9_]+\\($" name "${declaration}")
  string(REGEX REPLACE "\\($" "" name "${name}")
  list(APPEND declared "${name}")
endforeach()
list(SORT declared)

report_difference(expected exported "listed in public_symbols.txt but not exported by the library")
report_difference(exported expected "exported by the library but not listed in public_symbols.txt")
report_difference(declared expected "declared MOEKIT_API in moekit.h but not listed in public_symbols.txt")
report_difference(expected declared "listed in public_symbols.txt but not declared MOEKIT_API in moekit.h")

# 4. The dlopen example resolves every public function by name.
if(DLOPEN_SOURCE)
  file(READ "${DLOPEN_SOURCE}" dlopen_text)
  foreach(name IN LISTS expected)
    string(FIND "${dlopen_text}" "\"${name}\"" position)
    if(position EQUAL -1)
      fail("${DLOPEN_SOURCE} does not resolve \"${name}\"")
    endif()
  endforeach()
endif()

# 5. Version and SONAME: the header's version is the project's, and the SONAME is libmoekit.so.0.MINOR while
#    MAJOR is 0 (every minor release may break the ABI), libmoekit.so.MAJOR after.
foreach(part MAJOR MINOR PATCH)
  if(header_text MATCHES "#define MOEKIT_VERSION_${part} ([0-9]+)")
    set(header_${part} "${CMAKE_MATCH_1}")
  else()
    fail("moekit.h does not define MOEKIT_VERSION_${part}")
  endif()
endforeach()
if(NOT "${header_MAJOR}.${header_MINOR}.${header_PATCH}" STREQUAL "${PROJECT_VERSION}")
  fail("moekit.h says version ${header_MAJOR}.${header_MINOR}.${header_PATCH}, CMake's project() ${PROJECT_VERSION}")
endif()
if(header_MAJOR EQUAL 0)
  set(expected_soname "libmoekit.so.0.${header_MINOR}")
else()
  set(expected_soname "libmoekit.so.${header_MAJOR}")
endif()
execute_process(COMMAND "${READELF}" -d "${LIBRARY}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE readelf_status)
if(NOT readelf_status EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIBRARY} failed")
endif()
if(dynamic MATCHES "Library soname: \\[([^]]*)\\]")
  set(soname "${CMAKE_MATCH_1}")
  if(NOT soname STREQUAL expected_soname)
    fail("SONAME is ${soname}, expected ${expected_soname}")
  endif()
else()
  fail("${LIBRARY} has no SONAME")
endif()

list(LENGTH exported exported_count)
if(errors)
  message(FATAL_ERROR "ABI check of ${LIBRARY} failed:\n${errors}")
endif()
message(STATUS "${LIBRARY}: ${exported_count} functions exported, all moekit_*, equal to public_symbols.txt and "
               "to the MOEKIT_API functions of moekit.h; SONAME ${soname}")
