# The compiled runtime: the optional static library zerotk::runtime (fmt's FMT_HEADER_ONLY the other
# way round). zerotk stays header-only by default; a target that links zerotk::runtime compiles with
# ZEROTK_COMPILED_RUNTIME=1, so the headers only declare the threads back end, the host reductions
# and comm::Topology, and those are compiled once here (src/runtime/runtime.cpp) instead of in every
# translation unit that includes them (zerotk/core/runtime.hpp, docs/comm.md "Compiled runtime").
option(ZEROTK_RUNTIME "Build the compiled runtime zerotk::runtime (the compiled engine set needs it)" ON)
if(NOT ZEROTK_RUNTIME)
  return()
endif()
add_library(zerotk_runtime STATIC ${CMAKE_CURRENT_SOURCE_DIR}/src/runtime/runtime.cpp)
add_library(zerotk::runtime ALIAS zerotk_runtime)
set_target_properties(zerotk_runtime PROPERTIES EXPORT_NAME runtime)
# Inside another project (add_subdirectory), built only when something there links it.
if(NOT PROJECT_IS_TOP_LEVEL)
  set_target_properties(zerotk_runtime PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
# PUBLIC: whoever links the library must see the declarations only, never the inline definitions.
target_compile_definitions(zerotk_runtime PUBLIC ZEROTK_COMPILED_RUNTIME=1)
target_link_libraries(zerotk_runtime PUBLIC zerotk)
# The code compiled here depends on ZEROTK_HAS_OPENMP: its users compile with the same value.
if(TARGET zerotk::openmp)
  target_link_libraries(zerotk_runtime PUBLIC zerotk::openmp)
endif()
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(zerotk_runtime PRIVATE -Wall -Wextra -Wpedantic -Werror)
endif()
