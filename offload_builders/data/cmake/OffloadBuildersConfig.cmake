# find_package(OffloadBuilders) loads this file: point CMake at its directory with
#   cmake -DOffloadBuilders_DIR="$(offload-compile --cmake-dir)" ...
# (or add that directory to CMAKE_PREFIX_PATH); OffloadBuildersConfigVersion.cmake beside it gives the Python
# package's version (find_package(OffloadBuilders 0.1 REQUIRED): the same major version, not newer). It defines
# offload_add_executable, offload_add_library, offload_add_object_library and offload_target_sources: see
# OffloadBuilders.cmake.
include("${CMAKE_CURRENT_LIST_DIR}/OffloadBuilders.cmake")
