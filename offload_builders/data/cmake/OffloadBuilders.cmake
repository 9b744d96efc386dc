# Clang GPU offload compiles as one custom command per phase and target, each with its depfile, run by
# offload-compile; links through offload-link (the Clang driver runs it in clang-linker-wrapper's place).
#
#   find_package(OffloadBuilders REQUIRED)   # cmake -DOffloadBuilders_DIR="$(offload-compile --cmake-dir)"
#   offload_add_executable(app src/a.cpp src/k.hip src/s.cu)
#   target_include_directories(app PRIVATE include)          # and target_compile_definitions/options,
#   target_link_libraries(app PRIVATE mylib)                  # usage requirements of linked targets
#
# Functions (options in any order before or among the sources):
#   offload_add_executable(<name> [<options>] <sources>...)
#   offload_add_library(<name> STATIC|SHARED|OBJECT [<options>] <sources>...)
#   offload_add_object_library(<name> [<options>] <sources>...)   (= offload_add_library(<name> OBJECT ...):
#       an INTERFACE library whose objects and link flags go to the targets that link it)
#   offload_target_sources(<target> [<options>] <sources>...)     (add offload sources to an existing target)
#   offload_archs(<var> [OPENMP|HIP|CUDA] [ARCHS <ids>...])        (the canonical IDs a model compiles for)
# Options:
#   ARCHS <id>...           target IDs (default: the cache variable OFFLOAD_ARCHS)
#   FLAGS <flag>...         compile flags of every phase of every source
#   OPENMP_FLAGS/HIP_FLAGS/CUDA_FLAGS <flag>...   those of one model's sources
#   RDC                     HIP and CUDA relocatable device code (-fgpu-rdc; linked by offload-link)
#   LINK_LIBRARIES <lib>... target_link_libraries (their include directories, definitions and options apply)
#   SOURCES <src>...        (the sources may also follow the options directly)
# The model of a source is its suffix: .hip HIP (gfx targets), .cu CUDA (sm targets), else OpenMP C/C++
# (every target). Every phase gets FLAGS, the model's flags, CMAKE_<C|CXX>_FLAGS[_<CONFIG>], and the
# target's INCLUDE_DIRECTORIES, COMPILE_DEFINITIONS and COMPILE_OPTIONS (transitively, from what it links).
# The commands run in OFFLOAD_SOURCE_ROOT (default: the top source directory) and name the sources under it from
# there, as the SCons tool from its top directory: with that directory as the root, the same flags and targets give
# the SCons tool's objects byte for byte. Generators: Ninja, Unix Makefiles, Ninja Multi-Config (each configuration
# its own outputs, <target>.offload/<config>/, and its CMAKE_<C|CXX>_FLAGS_<CONFIG>).
include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.20)
  message(FATAL_ERROR "OffloadBuilders needs CMake 3.20 or later (add_custom_command DEPFILE); this is ${CMAKE_VERSION}")
endif()
# The functions below keep these policy settings (CMP0116: depfile paths, relative ones to the binary dir).
cmake_policy(PUSH)
cmake_policy(VERSION 3.20...4.4)

set(OFFLOAD_ARCHS "x86_64" CACHE STRING
  "Offload target IDs, comma-separated (x86_64 runs on this CPU; sm_90, gfx90a:xnack+, ...; native: this machine's GPUs, asked at every configure)")
set(OFFLOAD_SOURCE_ROOT "${CMAKE_SOURCE_DIR}" CACHE PATH
  "Where offload-compile runs; it names sources under it from here, as the SCons tool from its top directory (empty: the binary directory, absolute names)")
option(OFFLOAD_CUDA_ARCH_LIST
  "CUDA device and host compiles get all the source's targets (--targets: Clang 20+ defines __CUDA_ARCH_LIST__)" OFF)

# offload-compile and offload-link: on PATH, else beside the Python that holds this file (a virtual environment).
set(_offload_bins "${CMAKE_CURRENT_LIST_DIR}/../../../../../../bin" "${CMAKE_CURRENT_LIST_DIR}/../../../.venv/bin")
find_program(OFFLOAD_COMPILE offload-compile PATHS ${_offload_bins} DOC "offload-compile (offload-builders)")
find_program(OFFLOAD_LINK offload-link PATHS ${_offload_bins} DOC "offload-link (offload-builders)")
unset(_offload_bins)

function(_offload_not_found message)
  if(${CMAKE_FIND_PACKAGE_NAME}_FIND_REQUIRED OR NOT CMAKE_FIND_PACKAGE_NAME)
    message(FATAL_ERROR " ${message}")  # one line: CMake leaves text after a space unwrapped
  endif()
  set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${message}" PARENT_SCOPE)
  set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE PARENT_SCOPE)
endfunction()

foreach(_offload_tool IN ITEMS OFFLOAD_COMPILE OFFLOAD_LINK)
  if(NOT ${_offload_tool} OR NOT EXISTS "${${_offload_tool}}")
    string(TOLOWER "${_offload_tool}" _offload_name)
    string(REPLACE "_" "-" _offload_name "${_offload_name}")
    _offload_not_found("OffloadBuilders: ${_offload_name} not found (${_offload_tool}=${${_offload_tool}}): pip install offload-builders and put its bin directory on PATH, or set -D${_offload_tool}=<path>")
    cmake_policy(POP)
    return()
  endif()
endforeach()

# The link flags (--offload-link -B<shim dir> -L<runtime dir> ...): this also finds the Clang toolchain, so a
# missing one is one error here.
execute_process(COMMAND "${OFFLOAD_LINK}" --print-link-args RESULT_VARIABLE _offload_rc
  OUTPUT_VARIABLE _offload_out ERROR_VARIABLE _offload_err OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
if(NOT _offload_rc EQUAL 0)
  string(REPLACE "\n" " " _offload_err "${_offload_err}")
  _offload_not_found("OffloadBuilders: ${_offload_err}")
  cmake_policy(POP)
  return()
endif()
string(REPLACE "\n" ";" OFFLOAD_LINK_ARGS "${_offload_out}")       # OpenMP programs
set(OFFLOAD_RDC_LINK_ARGS "")                                       # HIP/CUDA relocatable device code
set(OFFLOAD_RUNTIME_DIR "")
foreach(_offload_arg IN LISTS OFFLOAD_LINK_ARGS)
  if(_offload_arg STREQUAL "--offload-link" OR _offload_arg MATCHES "^-B")
    list(APPEND OFFLOAD_RDC_LINK_ARGS "${_offload_arg}")
  elseif(_offload_arg MATCHES "^-L(.*)")
    set(OFFLOAD_RUNTIME_DIR "${CMAKE_MATCH_1}")
  endif()
endforeach()
unset(_offload_rc)
unset(_offload_out)
unset(_offload_err)

# The canonical comma-separated list of ARGN (commas or semicolons), or one error line naming what is wrong.
# `native` is resolved by offload-compile check (amdgpu-arch, nvptx-arch) at every configure: the answer is kept in
# a GLOBAL property, which lasts this configure run only, never in the cache (OFFLOAD_ARCHS stays `native`).
function(_offload_check_archs out)
  string(REPLACE ";" "," text "${ARGN}")
  get_property(known GLOBAL PROPERTY "_OFFLOAD_ARCHS_${text}")
  if(NOT known)
    execute_process(COMMAND "${OFFLOAD_COMPILE}" check "${text}" RESULT_VARIABLE rc OUTPUT_VARIABLE known
      ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      string(REPLACE "\n" " " err "${err}")
      message(FATAL_ERROR " OFFLOAD_ARCHS '${text}': ${err}")
    endif()
    if(text MATCHES "(^|,)[ \t]*native[ \t]*(,|$)")
      message(STATUS "OffloadBuilders: OFFLOAD_ARCHS '${text}' is ${known} on this machine (native: its GPUs)")
    endif()
    set_property(GLOBAL PROPERTY "_OFFLOAD_ARCHS_${text}" "${known}")
  endif()
  set(${out} "${known}" PARENT_SCOPE)
endfunction()

# offload_archs(<var> [OPENMP|HIP|CUDA] [ARCHS <ids>...]): the canonical target IDs (a CMake list) that sources
# of the model compile for: OPENMP (the default) all, HIP the AMDGPU ones, CUDA the NVPTX ones. Which IDs a model
# takes is offload-compile's rule (check --model), asked once per list and model in a configure run.
function(offload_archs var)
  cmake_parse_arguments(PARSE_ARGV 1 arg "OPENMP;HIP;CUDA" "" "ARCHS")
  if(NOT arg_ARCHS)
    set(arg_ARCHS "${OFFLOAD_ARCHS}")
  endif()
  _offload_check_archs(text ${arg_ARCHS})
  if(arg_HIP OR arg_CUDA)
    if(arg_HIP)
      set(model hip)
    else()
      set(model cuda)
    endif()
    get_property(chosen GLOBAL PROPERTY "_OFFLOAD_ARCHS_${model}_${text}" SET)
    if(chosen)
      get_property(text GLOBAL PROPERTY "_OFFLOAD_ARCHS_${model}_${text}")
    else()
      set(all "${text}")
      execute_process(COMMAND "${OFFLOAD_COMPILE}" check --model ${model} "${all}" RESULT_VARIABLE rc
        OUTPUT_VARIABLE text ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
      if(NOT rc EQUAL 0)
        string(REPLACE "\n" " " err "${err}")
        message(FATAL_ERROR " OFFLOAD_ARCHS '${all}': ${err}")
      endif()
      set_property(GLOBAL PROPERTY "_OFFLOAD_ARCHS_${model}_${all}" "${text}")
    endif()
  endif()
  string(REPLACE "," ";" chosen "${text}")
  set(${var} "${chosen}" PARENT_SCOPE)
endfunction()

function(_offload_model out src)
  if(src MATCHES "\\.hip$")
    set(${out} hip PARENT_SCOPE)
  elseif(src MATCHES "\\.cu$")
    set(${out} cuda PARENT_SCOPE)
  else()
    set(${out} openmp PARENT_SCOPE)
  endif()
endfunction()

# CMAKE_<lang>_FLAGS, and each configuration's CMAKE_<lang>_FLAGS_<CONFIG> as $<$<CONFIG:cfg>:flag> (multi-config).
function(_offload_config_flags out lang)
  separate_arguments(flags UNIX_COMMAND "${CMAKE_${lang}_FLAGS}")
  foreach(cfg IN LISTS CMAKE_CONFIGURATION_TYPES)
    string(TOUPPER "${cfg}" CFG)
    separate_arguments(cfg_flags UNIX_COMMAND "${CMAKE_${lang}_FLAGS_${CFG}}")
    foreach(flag IN LISTS cfg_flags)
      string(REPLACE ">" "$<ANGLE-R>" flag "${flag}")
      string(REPLACE "," "$<COMMA>" flag "${flag}")
      list(APPEND flags "$<$<CONFIG:${cfg}>:${flag}>")
    endforeach()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# A file whose bytes are `content` and whose mtime changes only when they do (file(GENERATE) rewrites only
# a changed file): Makefiles rerun on timestamps alone, so each node depends on the stamp of what its command
# line carries (flags, target lists) and reruns when that changes, as Ninja does by its command hash.
function(_offload_stamp tgt path content)
  get_property(done TARGET ${tgt} PROPERTY _OFFLOAD_STAMPS)
  if(NOT path IN_LIST done)
    file(GENERATE OUTPUT "${path}" CONTENT "${content}\n")
    set_property(TARGET ${tgt} APPEND PROPERTY _OFFLOAD_STAMPS "${path}")
  endif()
endfunction()

# The commands run in OFFLOAD_SOURCE_ROOT and name a source under it by its path from there, so the objects are the
# SCons tool's byte for byte (the bitcode's source_filename, __FILE__, debug info). Clang names such a source, a
# header found beside it or through a relative -I, relatively in the depfile, but CMake reads relative depfile paths
# from the binary directory: offload-compile --absolute-depfile names them by absolute path.

function(_offload_command output)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "COMMENT;WORKING_DIRECTORY" "OUTPUTS;COMMAND;DEPENDS")
  list(POP_FRONT arg_COMMAND phase)
  # offload-compile leaves an output whose bytes did not change untouched, which Ninja's restat turns into
  # stopping there. make has no restat across its passes: an output older than a header it was rebuilt for would
  # be rebuilt on every later build, so under Makefiles each node's outputs take the time it ran (what follows
  # them runs too).
  set(touch "")
  if(CMAKE_GENERATOR MATCHES "Makefiles")
    set(touch COMMAND "${CMAKE_COMMAND}" -E touch_nocreate "${output}" ${arg_OUTPUTS})
  endif()
  set(cwd "")
  if(arg_WORKING_DIRECTORY)
    set(cwd WORKING_DIRECTORY "${arg_WORKING_DIRECTORY}")
  endif()
  add_custom_command(OUTPUT "${output}" ${arg_OUTPUTS}
    COMMAND "${OFFLOAD_COMPILE}" ${phase} --depfile "${output}.d" --absolute-depfile ${arg_COMMAND} ${touch}
    DEPENDS ${arg_DEPENDS} DEPFILE "${output}.d" ${cwd} COMMENT "${arg_COMMENT}" COMMAND_EXPAND_LISTS VERBATIM)
endfunction()

# Compile databases (CMAKE_EXPORT_COMPILE_COMMANDS=ON): CMake lists only its own compile rules, never custom commands,
# and rewrites compile_commands.json at every generate. So each offload target's sources of one model also go into an
# OBJECT library, <target>.offload-<model>, that CMake lists and nothing builds: EXCLUDE_FROM_ALL, linked by no
# target, and no check of the compiler at configure. Its options are the phases' flags, the target's include
# directories, definitions and options (its usage requirements), and what `offload-compile compdb-args` adds: the
# model's mode (.hip and .cu sources are compiled as C++ with -x hip/-x cuda), the targets, the device-library and
# header flags, --offload-host-only (the host view: docs/editors.md). Each option travels as a SHELL: group, which
# CMake does not de-duplicate. QUERY are the flags compdb-args reads (without generator expressions).
function(_offload_compile_database tgt model archs)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "SOURCES;FLAGS;QUERY")
  get_target_property(type ${tgt} TYPE)
  set(prefix "")
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(prefix INTERFACE_)
  endif()
  list(FILTER arg_QUERY EXCLUDE REGEX "\\$<")
  string(JOIN "\n" key "${model}" "${archs}" ${arg_QUERY})
  string(SHA1 key "${key}")
  get_property(groups GLOBAL PROPERTY "_OFFLOAD_COMPDB_${key}")
  if(NOT groups)
    list(GET arg_SOURCES 0 first)
    execute_process(COMMAND "${OFFLOAD_COMPILE}" compdb-args "${first}" --targets "${archs}" --groups -- ${arg_QUERY}
      RESULT_VARIABLE rc OUTPUT_VARIABLE groups ERROR_VARIABLE err
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      string(REPLACE "\n" " " err "${err}")
      message(FATAL_ERROR " ${tgt}: ${err}")
    endif()
    string(REPLACE "\n" ";" groups "${groups}")
    list(TRANSFORM groups PREPEND "SHELL:")
    set_property(GLOBAL PROPERTY "_OFFLOAD_COMPDB_${key}" "${groups}")
  endif()
  set(db "${tgt}.offload-${model}")
  set(n 1)
  while(TARGET ${db})  # offload_target_sources called again for the target
    math(EXPR n "${n} + 1")
    set(db "${tgt}.offload-${model}-${n}")
  endwhile()
  add_library(${db} OBJECT EXCLUDE_FROM_ALL ${arg_SOURCES})
  if(NOT model STREQUAL "openmp")
    set_source_files_properties(${arg_SOURCES} PROPERTIES LANGUAGE CXX)
  endif()
  if(type MATCHES "^(SHARED|MODULE)_LIBRARY$")
    set_target_properties(${db} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  target_include_directories(${db} PRIVATE "$<TARGET_PROPERTY:${tgt},${prefix}INCLUDE_DIRECTORIES>")
  target_compile_definitions(${db} PRIVATE "$<TARGET_PROPERTY:${tgt},${prefix}COMPILE_DEFINITIONS>")
  target_compile_options(${db} PRIVATE ${arg_FLAGS} "$<TARGET_PROPERTY:${tgt},${prefix}COMPILE_OPTIONS>" ${groups})
endfunction()

# offload_target_sources(<target> [ARCHS ...] [FLAGS ...] [OPENMP_FLAGS|HIP_FLAGS|CUDA_FLAGS ...] [RDC]
#                        [LINK_LIBRARIES ...] [SOURCES] <sources>...)
function(offload_target_sources tgt)
  cmake_parse_arguments(PARSE_ARGV 1 arg "RDC" ""
    "ARCHS;FLAGS;OPENMP_FLAGS;HIP_FLAGS;CUDA_FLAGS;LINK_LIBRARIES;SOURCES")
  list(APPEND arg_SOURCES ${arg_UNPARSED_ARGUMENTS})
  get_target_property(type ${tgt} TYPE)
  set(prefix "")
  set(visibility PRIVATE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(prefix INTERFACE_)
    set(visibility INTERFACE)
  endif()
  if(arg_LINK_LIBRARIES)
    target_link_libraries(${tgt} ${visibility} ${arg_LINK_LIBRARIES})
  endif()
  if(NOT arg_ARCHS)
    set(arg_ARCHS "${OFFLOAD_ARCHS}")
  endif()
  # Multi-configuration generators (Ninja Multi-Config): each configuration its own outputs and flags.
  get_property(multi GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${tgt}.offload")
  if(multi)
    string(APPEND base "/$<CONFIG>")
  endif()
  string(TOUPPER "${CMAKE_BUILD_TYPE}" config)
  set(inc "$<TARGET_PROPERTY:${tgt},${prefix}INCLUDE_DIRECTORIES>")
  set(def "$<TARGET_PROPERTY:${tgt},${prefix}COMPILE_DEFINITIONS>")
  set(usage "$<$<BOOL:${inc}>:-I$<JOIN:${inc},$<SEMICOLON>-I>>" "$<$<BOOL:${def}>:-D$<JOIN:${def},$<SEMICOLON>-D>>"
    "$<TARGET_PROPERTY:${tgt},${prefix}COMPILE_OPTIONS>")
  if(type MATCHES "^(SHARED|MODULE)_LIBRARY$")
    list(APPEND usage -fPIC)
  endif()
  set(root "")
  if(OFFLOAD_SOURCE_ROOT)
    get_filename_component(root "${OFFLOAD_SOURCE_ROOT}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
    if(NOT IS_DIRECTORY "${root}")
      message(FATAL_ERROR " OFFLOAD_SOURCE_ROOT '${OFFLOAD_SOURCE_ROOT}' is not a directory")
    elseif(root MATCHES "\\\\")
      message(FATAL_ERROR " OFFLOAD_SOURCE_ROOT '${root}': a path with a backslash is not supported")
    endif()
  endif()
  set(models "")
  set(objects "")
  foreach(src IN LISTS arg_SOURCES)
    get_filename_component(path "${src}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${path}")
      message(FATAL_ERROR " ${tgt}: offload source '${src}' not found (${path})")
    endif()
    _offload_model(model "${path}")
    list(APPEND models ${model})
    file(RELATIVE_PATH rel "${CMAKE_CURRENT_SOURCE_DIR}" "${path}")
    string(REPLACE "../" "__/" rel "${rel}")
    string(REGEX REPLACE "^/" "" rel "${rel}")
    set(o "${base}/${rel}")
    get_filename_component(dir "${o}" DIRECTORY)
    if(multi)
      foreach(cfg IN LISTS CMAKE_CONFIGURATION_TYPES)
        string(REPLACE "$<CONFIG>" "${cfg}" cfg_dir "${dir}")
        file(MAKE_DIRECTORY "${cfg_dir}")
      endforeach()
    else()
      file(MAKE_DIRECTORY "${dir}")
    endif()

    # Flags and target list of the source's model; their stamps.
    set(lang CXX)
    if(model STREQUAL "openmp" AND path MATCHES "\\.c$")
      set(lang C)
    endif()
    if(multi)
      _offload_config_flags(lang_flags "${lang}")
    else()
      separate_arguments(lang_flags UNIX_COMMAND "${CMAKE_${lang}_FLAGS} ${CMAKE_${lang}_FLAGS_${config}}")
    endif()
    string(TOUPPER "${model}" MODEL)
    set(flags ${arg_FLAGS} ${arg_${MODEL}_FLAGS} ${lang_flags} ${usage})
    set(rdc FALSE)
    if(arg_RDC AND NOT model STREQUAL "openmp")
      list(APPEND flags -fgpu-rdc)
      set(rdc TRUE)
    endif()
    set(stamp_name "${model}.${lang}")
    if(rdc)
      string(APPEND stamp_name ".rdc")
    endif()
    set(flags_stamp "${base}/${stamp_name}.flags")
    string(JOIN "\n" content "# run in: ${root}" ${flags})  # (Makefiles: a new OFFLOAD_SOURCE_ROOT renames sources)
    _offload_stamp(${tgt} "${flags_stamp}" "${content}")
    if(model STREQUAL "openmp")
      offload_archs(archs ARCHS ${arg_ARCHS})
    else()
      offload_archs(archs ${MODEL} ARCHS ${arg_ARCHS})
    endif()
    if(NOT archs)
      _offload_check_archs(all ${arg_ARCHS})
      message(FATAL_ERROR " ${tgt}: '${src}' is ${MODEL}, but OFFLOAD_ARCHS '${all}' has no target for it"
        " (HIP: gfx IDs, CUDA: sm IDs)")
    endif()
    string(JOIN "," list ${archs})
    set(archs_stamp "${base}/${model}.archs")
    _offload_stamp(${tgt} "${archs_stamp}" "${list}")
    if(CMAKE_EXPORT_COMPILE_COMMANDS AND (lang STREQUAL "CXX" OR CMAKE_C_COMPILER_LOADED))
      list(APPEND db_${model} "${path}")  # its compile-database library (after the loop)
      set(db_archs_${model} "${list}")
      set(db_flags_${model} ${arg_FLAGS} ${arg_${MODEL}_FLAGS})
      if(rdc)
        list(APPEND db_flags_${model} -fgpu-rdc)
      endif()
      separate_arguments(db_query_${model} UNIX_COMMAND "${CMAKE_${lang}_FLAGS}")
      list(PREPEND db_query_${model} ${db_flags_${model}})
    endif()

    # The commands run in OFFLOAD_SOURCE_ROOT (relative paths in flags are from there) and name a source under it
    # by its path from there (the HIP/CUDA default CUID hashes that path), as the SCons tool from its top directory.
    set(given "${path}")
    set(run_in "")
    set(cuid "")
    if(root)
      set(run_in WORKING_DIRECTORY "${root}")
      file(RELATIVE_PATH from_root "${root}" "${path}")
      if(NOT from_root MATCHES "^\\.\\./" AND NOT IS_ABSOLUTE "${from_root}")
        set(given "${from_root}")
        # Every phase: the HIP/CUDA CUID's path (plain compiles) and the remote cache's root ($OFFLOAD_REMOTE).
        set(cuid --source-root "${root}")
      endif()
    endif()
    set(arch_list "")
    set(arch_list_stamp "")
    set(arch_list_check FALSE)
    if(model STREQUAL "cuda" AND OFFLOAD_CUDA_ARCH_LIST)
      set(arch_list --targets "${list}")
      set(arch_list_stamp "${archs_stamp}")
      # A device compile takes the list from the archs stamp (--targets-file, on no command line Ninja compares)
      # and depends on its list check instead (arch-list-check: what the list changes of its preprocessed text).
      # Ninja: the record, left untouched when unchanged, stops it through restat. make compares times only (the
      # record takes the time its check ran, or the check would rerun at every build): the device command runs,
      # and with --archlist-record keeps its outputs where the record and its own command are as they were.
      set(arch_list_check TRUE)
    endif()

    set(images "")
    if(model STREQUAL "openmp")
      _offload_command("${o}.host.bc" OUTPUTS "${o}.host.bc.identity" COMMENT "offload host ${rel}" ${run_in}
        COMMAND host "${given}" -o "${o}.host.bc" -- ${flags}
        DEPENDS "${path}" "${flags_stamp}")
      foreach(arch IN LISTS archs)
        string(REPLACE ":" "_" name "${arch}")
        _offload_command("${o}.${name}.dev" COMMENT "offload device ${arch} ${rel}" ${run_in}
          COMMAND device "${given}" --host-bc "${o}.host.bc" --target "${arch}" -o "${o}.${name}.dev" -- ${flags}
          DEPENDS "${path}" "${o}.host.bc" "${flags_stamp}")
        list(APPEND images "${o}.${name}.dev")
      endforeach()
      _offload_command("${o}.pkg" COMMENT "offload package ${rel}" ${run_in}
        COMMAND package "${given}" ${images} --targets "${list}" -o "${o}.pkg" -- ${flags}
        DEPENDS ${images} "${archs_stamp}")
      _offload_command("${o}.o" COMMENT "offload embed ${rel}" ${run_in}
        COMMAND embed "${given}" --host-bc "${o}.host.bc" --package "${o}.pkg" -o "${o}.o" -- ${flags}
        DEPENDS "${o}.host.bc" "${o}.pkg" "${flags_stamp}")
    else()
      if(rdc)
        set(suffix .bc)
        if(model STREQUAL "cuda")
          set(suffix .cubin)
        endif()
      elseif(model STREQUAL "hip")
        set(suffix .hsaco)
      else()
        set(suffix .cubin)
      endif()
      foreach(arch IN LISTS archs)
        string(REPLACE ":" "_" name "${arch}")
        set(image "${o}.${name}${suffix}")
        set(extra "")
        if(model STREQUAL "cuda" AND NOT rdc)
          set(extra "${image}.ptx")                   # the PTX the fat binary also holds
        endif()
        if(arch_list_check)
          _offload_command("${o}.${name}.archlist" COMMENT "offload arch-list check ${arch} ${rel}" ${run_in}
            COMMAND arch-list-check "${given}" --target "${arch}" ${arch_list} ${cuid} -o "${o}.${name}.archlist"
              -- ${flags}
            DEPENDS "${path}" "${flags_stamp}" ${arch_list_stamp})
          set(seen "")
          if(CMAKE_GENERATOR MATCHES "Makefiles")
            set(seen --archlist-record "${o}.${name}.archlist")
            list(APPEND extra "${image}.archlist-seen")
          endif()
          _offload_command("${image}" OUTPUTS ${extra} COMMENT "offload device ${arch} ${rel}" ${run_in}
            COMMAND device "${given}" --target "${arch}" --targets-file "${archs_stamp}" ${seen} ${cuid}
              -o "${image}" -- ${flags}
            DEPENDS "${path}" "${flags_stamp}" "${o}.${name}.archlist")
        else()
          _offload_command("${image}" OUTPUTS ${extra} COMMENT "offload device ${arch} ${rel}" ${run_in}
            COMMAND device "${given}" --target "${arch}" ${arch_list} ${cuid} -o "${image}" -- ${flags}
            DEPENDS "${path}" "${flags_stamp}" ${arch_list_stamp})
        endif()
        list(APPEND images "${image}")
      endforeach()
      if(rdc)
        set(device_side "${o}.pkg")
        _offload_command("${o}.pkg" COMMENT "offload package ${rel}" ${run_in}
          COMMAND package "${given}" ${images} --targets "${list}" -o "${o}.pkg" -- ${flags}
          DEPENDS ${images} "${archs_stamp}")
        set(device_option --package)
      else()
        set(device_side "${o}.fatbin")
        _offload_command("${o}.fatbin" COMMENT "offload bundle ${rel}" ${run_in}
          COMMAND bundle "${given}" ${images} --targets "${list}" -o "${o}.fatbin" -- ${flags}
          DEPENDS ${images} "${archs_stamp}")
        set(device_option --fatbin)
      endif()
      _offload_command("${o}.o" COMMENT "offload host ${rel}" ${run_in}
        COMMAND host "${given}" ${device_option} "${device_side}" ${arch_list} ${cuid} -o "${o}.o" -- ${flags}
        DEPENDS "${path}" "${device_side}" "${flags_stamp}" ${arch_list_stamp})
    endif()
    if(NOT multi)  # (a path with $<CONFIG> is an object by its suffix, and generated as a custom command's output)
      set_source_files_properties("${o}.o" PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    endif()
    list(APPEND objects "${o}.o")
  endforeach()

  foreach(model IN ITEMS openmp hip cuda)
    if(db_${model})
      _offload_compile_database(${tgt} ${model} "${db_archs_${model}}" SOURCES ${db_${model}}
        FLAGS ${db_flags_${model}} QUERY ${db_query_${model}})
    endif()
  endforeach()

  # The objects, and the link flags: OpenMP programs link through offload-link with libomptarget (and run with
  # its directory as run path), HIP/CUDA relocatable device code through offload-link.
  target_sources(${tgt} PRIVATE ${objects})
  set(link "")
  if("openmp" IN_LIST models)
    set(link ${OFFLOAD_LINK_ARGS} "LINKER:-rpath,${OFFLOAD_RUNTIME_DIR}")
  elseif(arg_RDC)
    set(link ${OFFLOAD_RDC_LINK_ARGS})
  endif()
  if(link AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR " ${tgt}: link with Clang (CMAKE_CXX_COMPILER=clang++-19): it runs offload-link as its"
      " linker wrapper; CMAKE_CXX_COMPILER is '${CMAKE_CXX_COMPILER}' (${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_link_libraries(${tgt} INTERFACE ${objects})
    target_link_options(${tgt} INTERFACE ${link})
  else()
    set_target_properties(${tgt} PROPERTIES LINKER_LANGUAGE CXX)
    if(type STREQUAL "STATIC_LIBRARY")
      target_link_options(${tgt} INTERFACE ${link})
    else()
      target_link_options(${tgt} PRIVATE ${link})
    endif()
  endif()
endfunction()

function(offload_add_executable name)
  add_executable(${name})
  offload_target_sources(${name} ${ARGN})
endfunction()

function(offload_add_library name kind)
  if(kind STREQUAL "OBJECT")
    add_library(${name} INTERFACE)
  elseif(kind MATCHES "^(STATIC|SHARED)$")
    add_library(${name} ${kind})
  else()
    message(FATAL_ERROR " offload_add_library(${name} ${kind}): the kind is STATIC, SHARED or OBJECT")
  endif()
  offload_target_sources(${name} ${ARGN})
endfunction()

function(offload_add_object_library name)
  offload_add_library(${name} OBJECT ${ARGN})
endfunction()

cmake_policy(POP)
