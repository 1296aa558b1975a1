# Helpers shared by every target.
#
# Build-time layout (issue 37, measured on a 2-core machine with GCC 12):
# - Every translation unit is put in one of three groups by what its own includes reach (the scan
#   below follows "..." includes through the tree):
#     torch  — anything of LibTorch beyond <ATen/core/Tensor.h> (torch/torch.h, ATen/ATen.h, ...);
#     tensor — <ATen/core/Tensor.h> and nothing heavier;
#     core   — no LibTorch header at all.
#   Each group has its own precompiled header (cmake/pch_<group>.hpp). Why: GCC loads a
#   precompiled header whole, and the one of <torch/torch.h> with CAF is ~740 MB: loading it cost
#   ~10 s of CPU per translation unit, while the tensor one (~250 MB) costs ~1.4 s and the core
#   one (~190 MB) ~0.9 s; parsing <torch/torch.h> without one costs ~20 s.
# - Each folder library is a static library made of up to three object libraries, one per group,
#   each a unity build (several sources per translation unit) with a batch size per group: the
#   torch group pays the most per translation unit, so its batches amortize the most, but they stay
#   small enough that touching one file recompiles a batch in well under a minute.

set(STARLING_UNITY_BATCH_torch 4 CACHE STRING "sources per unity batch, LibTorch translation units")
set(STARLING_UNITY_BATCH_tensor 6 CACHE STRING "sources per unity batch, tensor-only translation units")
set(STARLING_UNITY_BATCH_core 8 CACHE STRING "sources per unity batch, torch-free translation units")
option(STARLING_UNITY "unity builds (several sources per translation unit)" ON)

# Compile options, include path and link libraries of one target (no precompiled header).
function(starling_target_defaults target)
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter
                         -Wno-missing-field-initializers)
  target_compile_definitions(${target} PUBLIC USE_C10D_GLOO)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} ${CAF_CORE} ${CAF_IO} ${GLOO_LIB}
                        fmt::fmt Threads::Threads)
endfunction()

# The direct includes of one file, cached: "..." includes resolved in the tree (relative to the
# file, the source root, then tests/), and whether the file itself includes LibTorch headers.
function(_starling_direct_includes file out_files out_kind)
  get_property(done GLOBAL PROPERTY "STARLING_INC_DONE_${file}" SET)
  if(NOT done)
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    set(found)
    set(kind core)
    get_filename_component(dir "${file}" DIRECTORY)
    foreach(line IN LISTS lines)
      if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        set(name "${CMAKE_MATCH_1}")
        foreach(base "${dir}" "${CMAKE_SOURCE_DIR}" "${CMAKE_SOURCE_DIR}/tests")
          if(EXISTS "${base}/${name}" AND NOT IS_DIRECTORY "${base}/${name}")
            get_filename_component(p "${base}/${name}" ABSOLUTE)
            list(APPEND found "${p}")
            break()
          endif()
        endforeach()
      elseif(line MATCHES "#[ \t]*include[ \t]*<((torch|ATen|c10|caffe2)/[^>]+)>")
        if(CMAKE_MATCH_1 STREQUAL "ATen/core/Tensor.h")
          if(kind STREQUAL "core")
            set(kind tensor)
          endif()
        else()
          set(kind torch)
        endif()
      endif()
    endforeach()
    set_property(GLOBAL PROPERTY "STARLING_INC_DONE_${file}" 1)
    set_property(GLOBAL PROPERTY "STARLING_INC_FILES_${file}" "${found}")
    set_property(GLOBAL PROPERTY "STARLING_INC_KIND_${file}" "${kind}")
  endif()
  get_property(f GLOBAL PROPERTY "STARLING_INC_FILES_${file}")
  get_property(k GLOBAL PROPERTY "STARLING_INC_KIND_${file}")
  set(${out_files} "${f}" PARENT_SCOPE)
  set(${out_kind} "${k}" PARENT_SCOPE)
endfunction()

# The group of one source (torch, tensor or core): the heaviest LibTorch include its closure reaches.
function(starling_source_group src out)
  get_filename_component(src "${src}" ABSOLUTE)
  set(queue "${src}")
  set(seen)
  set(group core)
  while(queue)
    list(POP_FRONT queue f)
    if(f IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${f}")
    _starling_direct_includes("${f}" incs kind)
    if(kind STREQUAL "torch")
      set(group torch)
      break()
    elseif(kind STREQUAL "tensor")
      set(group tensor)
    endif()
    list(APPEND queue ${incs})
  endwhile()
  set(${out} ${group} PARENT_SCOPE)
endfunction()

# The precompiled header of each group, built once and reused by every target of that group.
function(starling_pch_targets)
  foreach(group torch tensor core)
    add_library(starling_pch_${group} OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch.cpp)
    starling_target_defaults(starling_pch_${group})
    # Named as <cmake/pch_GROUP.hpp> (found through the source root on the include path), so the
    # generated cmake_pch.hxx holds no absolute path and ccache can hit in another clone.
    target_precompile_headers(starling_pch_${group} PRIVATE "<cmake/pch_${group}.hpp>")
  endforeach()
endfunction()

# The translation units of one object library: with STARLING_UNITY, batches of `batch` sources
# (in path order, so a batch holds neighbours of one folder), each a generated file in
# <build>/unity/ that includes its sources by their path from the source root. The generated file
# names no absolute path, so ccache (CCACHE_BASEDIR) hits in another clone of the tree too, which
# CMake's own UNITY_BUILD files (absolute #include paths) never do. A batch of one is the source.
function(starling_unity_sources target batch out)
  set(srcs ${ARGN})
  list(SORT srcs)
  list(LENGTH srcs n)
  if(NOT STARLING_UNITY OR batch LESS 2 OR n LESS 2)
    set(${out} ${srcs} PARENT_SCOPE)
    return()
  endif()
  set(result)
  set(index 0)
  set(i 0)
  while(i LESS n)
    math(EXPR end "${i} + ${batch}")
    if(end GREATER n)
      set(end ${n})
    endif()
    math(EXPR count "${end} - ${i}")
    if(count EQUAL 1)
      list(GET srcs ${i} only)
      list(APPEND result ${only})
    else()
      set(text "// Generated by cmake/starling.cmake (unity build of ${target}): do not edit.\n")
      set(j ${i})
      while(j LESS end)
        list(GET srcs ${j} src)
        file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${src})
        string(APPEND text "#include \"${rel}\"\n")
        math(EXPR j "${j} + 1")
      endwhile()
      set(unity ${CMAKE_BINARY_DIR}/unity/${target}_${index}.cpp)
      # Written only when its text changes, so a configure recompiles nothing by itself.
      file(CONFIGURE OUTPUT ${unity} CONTENT "${text}" @ONLY)
      list(APPEND result ${unity})
      math(EXPR index "${index} + 1")
    endif()
    set(i ${end})
  endwhile()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Object libraries, one per group, from `srcs`: named <prefix>_<group>; their names are returned
# in `out`. Each links `deps` (for usage requirements) and reuses its group's precompiled header.
function(starling_group_objects prefix out)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;DEFINITIONS" ${ARGN})
  set(torch_srcs)
  set(tensor_srcs)
  set(core_srcs)
  foreach(src IN LISTS ARG_SOURCES)
    starling_source_group("${src}" g)
    list(APPEND ${g}_srcs "${src}")
  endforeach()
  set(objs)
  foreach(group torch tensor core)
    if(${group}_srcs)
      set(t ${prefix}_${group})
      list(LENGTH ${group}_srcs n)
      starling_unity_sources(${t} ${STARLING_UNITY_BATCH_${group}} compiled ${${group}_srcs})
      add_library(${t} OBJECT ${compiled})
      starling_target_defaults(${t})
      target_precompile_headers(${t} REUSE_FROM starling_pch_${group})
      if(ARG_DEPS)
        target_link_libraries(${t} PUBLIC ${ARG_DEPS})
      endif()
      if(ARG_DEFINITIONS)
        target_compile_definitions(${t} PRIVATE ${ARG_DEFINITIONS})
      endif()
      # Generated Cap'n Proto headers exist before any source that may include them compiles.
      if(TARGET starling_capnp)
        add_dependencies(${t} starling_capnp)
      endif()
      list(APPEND objs ${t})
      list(LENGTH compiled units)
      set_property(GLOBAL APPEND PROPERTY STARLING_GROUP_COUNTS
                   "${prefix}: ${group} ${n} sources in ${units} translation units")
    endif()
  endforeach()
  set(${out} ${objs} PARENT_SCOPE)
endfunction()

# The object files of `objs` (object library names; `$<TARGET_OBJECTS:...>` entries pass as they are).
function(starling_object_files out)
  set(files)
  foreach(o ${ARGN})
    if(o MATCHES "^\\$<")
      list(APPEND files ${o})
    else()
      list(APPEND files $<TARGET_OBJECTS:${o}>)
    endif()
  endforeach()
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# One static library from every .cpp under a folder (tests and mains excluded), made of one object
# library per group. DEPS are linked publicly (the library's own dependencies).
function(starling_folder_library target folder)
  cmake_parse_arguments(ARG "" "" "EXCLUDE;DEPS;OBJECTS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${folder}/*.cpp)
  foreach(ex ${ARG_EXCLUDE})
    list(REMOVE_ITEM srcs ${CMAKE_SOURCE_DIR}/${ex})
  endforeach()
  list(FILTER srcs EXCLUDE REGEX "_test\\.cpp$")
  starling_group_objects(${target} objs SOURCES ${srcs} DEPS ${ARG_DEPS})
  starling_object_files(obj_files ${ARG_OBJECTS} ${objs})
  add_library(${target} STATIC ${obj_files})
  set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  starling_target_defaults(${target})
  if(ARG_DEPS)
    target_link_libraries(${target} PUBLIC ${ARG_DEPS})
  endif()
endfunction()

# One executable from sources split by group (each group an object library); `libs` linked.
function(starling_executable target)
  cmake_parse_arguments(ARG "EXCLUDE_FROM_ALL" "" "SOURCES;LIBS;DEFINITIONS;OBJECTS" ${ARGN})
  starling_group_objects(${target} objs SOURCES ${ARG_SOURCES} DEPS ${ARG_LIBS}
                         DEFINITIONS ${ARG_DEFINITIONS})
  starling_object_files(obj_files ${ARG_OBJECTS} ${objs})
  if(ARG_EXCLUDE_FROM_ALL)
    add_executable(${target} EXCLUDE_FROM_ALL ${obj_files})
    foreach(o ${objs})
      set_target_properties(${o} PROPERTIES EXCLUDE_FROM_ALL ON)
    endforeach()
  else()
    add_executable(${target} ${obj_files})
  endif()
  set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  starling_target_defaults(${target})
  target_link_libraries(${target} PRIVATE ${ARG_LIBS})
endfunction()
