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
