# Finds zerotk's optional dependencies. Nothing is ever downloaded: a missing package only disables
# the component that needs it (and says so), unless the user asked for it explicitly.

find_package(Threads REQUIRED)
option(ZEROTK_WITH_OPENMP "Use OpenMP in host kernels when found" ON)
if(ZEROTK_WITH_OPENMP)
  find_package(OpenMP QUIET COMPONENTS CXX)
endif()
find_package(Eigen3 3.4 QUIET NO_MODULE)
find_package(nlohmann_json 3.10 QUIET)
find_package(MPI QUIET COMPONENTS CXX)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBURING QUIET IMPORTED_TARGET liburing)
  # XXH3-64 checksums of checkpoint files (used header-only: XXH_INLINE_ALL).
  pkg_check_modules(LIBXXHASH QUIET IMPORTED_TARGET libxxhash)
endif()

# CUDA: the toolkit (cudart, CCCL headers) for host code, the CUDA language for kernels.
set(ZEROTK_CUDA_ENABLED OFF)
if(NOT ZEROTK_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    set(ZEROTK_CUDA_ENABLED ON)
  elseif(ZEROTK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZEROTK_CUDA=ON but no CUDA toolkit/nvcc was found. Install the CUDA toolkit "
                        "or configure with -DZEROTK_CUDA=OFF.")
  endif()
endif()
if(ZEROTK_CUDA_ENABLED)
  find_package(NCCL QUIET)
endif()

# libtorch (PyTorch's C++ API) for the adapter in zerotk/interop/torch.hpp. Debian 12's libtorch-dev
# ships TorchConfig.cmake in the default prefix; a downloaded libtorch is found with
# -DCMAKE_PREFIX_PATH=<libtorch>. Its headers are slow to compile, so only the adapter's own test
# and example include them.
set(ZEROTK_WITH_TORCH "AUTO" CACHE STRING "Build the libtorch adapter's tests and example: AUTO (when libtorch is found), ON (required), OFF")
set_property(CACHE ZEROTK_WITH_TORCH PROPERTY STRINGS AUTO ON OFF)
set(ZEROTK_TORCH_ENABLED OFF)
if(NOT ZEROTK_WITH_TORCH STREQUAL "OFF")
  get_directory_property(_zerotk_imported_before IMPORTED_TARGETS)
  find_package(Torch QUIET)
  # Imported targets are visible in the directory that found them and below. Under add_subdirectory a
  # consumer that links zerotk::torch needs Torch's targets (torch -> torch_cpu, c10, ...) in its own
  # scope at generate time: make the ones this find_package created global (issue 57 item 13; CTest
  # package.add_subdirectory_torch).
  if(Torch_FOUND AND NOT PROJECT_IS_TOP_LEVEL)
    get_directory_property(_zerotk_imported_after IMPORTED_TARGETS)
    foreach(_t IN LISTS _zerotk_imported_after)
      if(NOT _t IN_LIST _zerotk_imported_before)
        get_target_property(_global ${_t} IMPORTED_GLOBAL)
        if(NOT _global)
          set_target_properties(${_t} PROPERTIES IMPORTED_GLOBAL TRUE)
        endif()
      endif()
    endforeach()
  endif()
  # libtorch 1.13's headers (Debian 12) do not compile as C++20 with clang: their std::vector<c10::IValue>
  # members are instantiated while IValue is incomplete. AUTO leaves the adapter out there (only 1.13
  # was tried; ON still builds it).
  set(_zerotk_torch_vs_clang OFF)
  if(Torch_FOUND AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND Torch_VERSION VERSION_LESS 2)
    set(_zerotk_torch_vs_clang ON)
  endif()
  if(Torch_FOUND AND TARGET torch AND _zerotk_torch_vs_clang AND ZEROTK_WITH_TORCH STREQUAL "AUTO")
    message(STATUS "zerotk: libtorch ${Torch_VERSION}'s headers do not compile as C++20 with clang: the torch "
                   "adapter's tests and example are not built (-DZEROTK_WITH_TORCH=ON to try anyway)")
  elseif(Torch_FOUND AND TARGET torch)
    set(ZEROTK_TORCH_ENABLED ON)
  elseif(ZEROTK_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "ZEROTK_WITH_TORCH=ON but libtorch was not found. Install it (Debian: apt-get install "
                        "libtorch-dev), point CMAKE_PREFIX_PATH at an unpacked libtorch, or configure with "
                        "-DZEROTK_WITH_TORCH=OFF.")
  else()
    message(STATUS "zerotk: libtorch not found: the torch adapter's tests and example are not built "
                   "(Debian: apt-get install libtorch-dev)")
  endif()
endif()
