# find_package(OffloadBuilders <version>|<min>...<max> [EXACT]): the version is the Python package's, read from the
# offload_builders/__init__.py that holds this directory (its one source, so it cannot go stale). Compatible as
# write_basic_package_version_file's SameMajorVersion: a request of the same major version that is not newer, or a
# range holding it whose minimum has its major version.
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../../__init__.py" _offload_line REGEX "^__version__ = " LIMIT_COUNT 1)
if(NOT _offload_line MATCHES "^__version__ = [\"']([0-9]+(\\.[0-9]+)*)[\"']")
  set(PACKAGE_VERSION "unknown")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)  # no __version__ beside this directory: not an offload-builders install
  return()
endif()
set(PACKAGE_VERSION "${CMAKE_MATCH_1}")
string(REGEX MATCH "^[0-9]+" _offload_major "${PACKAGE_VERSION}")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(PACKAGE_FIND_VERSION_RANGE)
  if(PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "INCLUDE")
    set(_offload_below_max "${PACKAGE_VERSION}" VERSION_LESS_EQUAL "${PACKAGE_FIND_VERSION_MAX}")
  else()
    set(_offload_below_max "${PACKAGE_VERSION}" VERSION_LESS "${PACKAGE_FIND_VERSION_MAX}")
  endif()
  if(PACKAGE_FIND_VERSION_MIN_MAJOR EQUAL _offload_major
     AND PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION_MIN AND (${_offload_below_max}))
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
  unset(_offload_below_max)
elseif(PACKAGE_FIND_VERSION_MAJOR EQUAL _offload_major AND PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
set(PACKAGE_VERSION_EXACT FALSE)
if(PACKAGE_VERSION VERSION_EQUAL PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
unset(_offload_line)
unset(_offload_major)
