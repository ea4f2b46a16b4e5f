# Install rules: headers, one export set for the core and one per optional component, so a consumer
# machine that lacks, say, MPI can still use the core and ask only for what it has:
#   find_package(zerotk REQUIRED COMPONENTS mpi)   -> zerotk::zerotk, zerotk::mpi
set(ZEROTK_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/zerotk")

install(DIRECTORY include/zerotk DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS zerotk EXPORT zerotkTargets)
install(EXPORT zerotkTargets NAMESPACE zerotk:: DESTINATION ${ZEROTK_CMAKE_DIR})

foreach(_c IN LISTS ZEROTK_COMPONENTS_FOUND)
  install(TARGETS zerotk_${_c} EXPORT zerotk-${_c}Targets)
  install(EXPORT zerotk-${_c}Targets NAMESPACE zerotk:: DESTINATION ${ZEROTK_CMAKE_DIR})
endforeach()

# The compiled libraries, each a component of its own: find_package(zerotk COMPONENTS engines)
# gives zerotk::engines (and the zerotk::runtime and components it links). Their link interfaces name
# the components they were built with; the package config loads those first (ZEROTK_COMPILED_DEPS_*).
# Inside another project they are built only when linked there (EXCLUDE_FROM_ALL), so not installed.
set(ZEROTK_COMPILED_COMPONENTS "")
foreach(_c runtime engines)
  if(TARGET zerotk_${_c} AND PROJECT_IS_TOP_LEVEL)
    install(TARGETS zerotk_${_c} EXPORT zerotk-${_c}Targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
    install(EXPORT zerotk-${_c}Targets NAMESPACE zerotk:: DESTINATION ${ZEROTK_CMAKE_DIR})
    list(APPEND ZEROTK_COMPILED_COMPONENTS ${_c})
  endif()
endforeach()
set(ZEROTK_COMPILED_DEPS_runtime "")
set(ZEROTK_COMPILED_DEPS_engines runtime)
foreach(_c openmp uring json)
  if(TARGET zerotk::${_c})
    list(APPEND ZEROTK_COMPILED_DEPS_engines ${_c})
  endif()
endforeach()
if(TARGET zerotk::openmp)
  list(APPEND ZEROTK_COMPILED_DEPS_runtime openmp)
endif()

configure_package_config_file(cmake/zerotkConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfig.cmake"
  INSTALL_DESTINATION ${ZEROTK_CMAKE_DIR})
# The headers are ABI-free; the compiled libraries (runtime, engines) are built for this machine's
# architecture, so the version file checks it only when they are installed.
if(ZEROTK_COMPILED_COMPONENTS)
  write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/zerotkConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion)
else()
  write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/zerotkConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
endif()
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfigVersion.cmake"
  cmake/FindNCCL.cmake
  DESTINATION ${ZEROTK_CMAKE_DIR})
