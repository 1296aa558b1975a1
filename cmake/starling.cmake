# Helpers shared by every target.

# Compile options, link libraries and the shared precompiled header for one target.
function(starling_target_defaults target)
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter
                         -Wno-missing-field-initializers)
  target_compile_definitions(${target} PUBLIC USE_C10D_GLOO)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} ${CAF_CORE} ${CAF_IO} ${GLOO_LIB}
                        fmt::fmt Threads::Threads)
  if(NOT target STREQUAL "starling_pch")
    target_precompile_headers(${target} REUSE_FROM starling_pch)
  endif()
endfunction()

# One static library from every .cpp under a folder (tests and mains excluded).
function(starling_folder_library target folder)
  cmake_parse_arguments(ARG "" "" "EXCLUDE" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${folder}/*.cpp)
  foreach(ex ${ARG_EXCLUDE})
    list(REMOVE_ITEM srcs ${CMAKE_SOURCE_DIR}/${ex})
  endforeach()
  list(FILTER srcs EXCLUDE REGEX "_test\\.cpp$")
  list(APPEND srcs ${ARG_UNPARSED_ARGUMENTS})
  if(NOT srcs)
    set(srcs ${CMAKE_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  add_library(${target} STATIC ${srcs})
  starling_target_defaults(${target})
endfunction()
