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

configure_package_config_file(cmake/zerotkConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfig.cmake"
  INSTALL_DESTINATION ${ZEROTK_CMAKE_DIR})
# Header-only and ABI-free: any compiler may consume it, so the version file is arch independent.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/zerotkConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/zerotkConfigVersion.cmake"
  cmake/FindNCCL.cmake
  DESTINATION ${ZEROTK_CMAKE_DIR})
