# The compiled engine set: the optional component zerotk::engines, a static library with one
# translation unit per family of engine types (include/zerotk/engines/set.hpp lists them). A
# trainer that links it and includes <zerotk/engines.hpp> links those engines instead of compiling
# them (docs/engine.md, "The compiled engine set"). Pick the families with ZEROTK_ENGINES, as
# CUTLASS_LIBRARY_KERNELS picks kernels: -DZEROTK_ENGINES="adamw_bf16;offload_cpu".
set(ZEROTK_ENGINE_FAMILIES adamw_fp32 adamw_bf16 adamw_fp16 offload_cpu offload_nvme lion onebit compression)
set(ZEROTK_ENGINES "${ZEROTK_ENGINE_FAMILIES}" CACHE STRING
    "Families of the compiled engine set zerotk::engines (any of: ${ZEROTK_ENGINE_FAMILIES}); empty: no library")

# Whether a target that links zerotk::torch may link the set too (set below): not when libtorch
# carries the pre-C++11 string ABI (a downloaded libtorch's -D_GLIBCXX_USE_CXX11_ABI=0), which the
# set, compiled without torch's flags, does not use.
set(ZEROTK_ENGINES_WITH_TORCH OFF)
if(NOT ZEROTK_ENGINES)
  return()
endif()
if(NOT TARGET zerotk_runtime)
  message(FATAL_ERROR "ZEROTK_ENGINES: the compiled engine set links the compiled runtime, which ZEROTK_RUNTIME=OFF "
                      "leaves out; set ZEROTK_ENGINES to \"\" too, or ZEROTK_RUNTIME=ON")
endif()
add_library(zerotk_engines STATIC)
add_library(zerotk::engines ALIAS zerotk_engines)
set_target_properties(zerotk_engines PROPERTIES EXPORT_NAME engines)
# Inside another project (add_subdirectory), built only when something there links it.
if(NOT PROJECT_IS_TOP_LEVEL)
  set_target_properties(zerotk_engines PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
foreach(_family IN LISTS ZEROTK_ENGINES)
  if(NOT _family IN_LIST ZEROTK_ENGINE_FAMILIES)
    message(FATAL_ERROR "ZEROTK_ENGINES: unknown family '${_family}' (known: ${ZEROTK_ENGINE_FAMILIES})")
  endif()
  string(TOUPPER "${_family}" _macro)
  target_sources(zerotk_engines PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/engines/${_family}.cpp)
  target_compile_definitions(zerotk_engines PUBLIC ZEROTK_ENGINES_${_macro}=1)
endforeach()
# AnyEngine's compiled half: make_engine picks from the families above; make_engine_from_file reads
# the JSON here (with nlohmann-json; without it, the function says how to get it).
target_sources(zerotk_engines PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/engines/make_engine.cpp
                                      ${CMAKE_CURRENT_SOURCE_DIR}/src/engines/any_engine.cpp)
if(TARGET zerotk::json)
  target_sources(zerotk_engines PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/engines/config_file.cpp)
  target_link_libraries(zerotk_engines PRIVATE zerotk::json)
else()
  target_sources(zerotk_engines PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/engines/config_file_missing.cpp)
endif()
# The engines' code depends on these feature macros (kernels' OpenMP, the NVMe store's io_uring):
# whoever links the set compiles with the same ones.
# The engines' communicator code (threads back end, host reductions, topology) comes from the
# compiled runtime: a program is either all header-only or all compiled (docs/comm.md), and
# whoever links the set links the runtime too.
target_link_libraries(zerotk_engines PUBLIC zerotk zerotk::runtime)
foreach(_c openmp uring)
  if(TARGET zerotk::${_c})
    target_link_libraries(zerotk_engines PUBLIC zerotk::${_c})
  endif()
endforeach()
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(zerotk_engines PRIVATE -Wall -Wextra -Wpedantic -Werror)
endif()
if(NOT "${TORCH_CXX_FLAGS}" MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  set(ZEROTK_ENGINES_WITH_TORCH ON)
endif()
