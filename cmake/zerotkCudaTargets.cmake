# Helpers for zerotk's own CUDA executables (tests and examples); not installed.
#   zerotk_cuda_executable(<target> <sources...>)  nvcc, C++20, sm_80/sm_90 (or CMAKE_CUDA_ARCHITECTURES),
#                                                  linked to zerotk::cuda, part of `zerotk_cuda_all`
#   ZEROTK_GPU_USABLE                              ON where nvidia-smi lists a GPU (CUDA tests run)
# Included by every directory that builds CUDA executables: enable_language() applies to the including
# directory and below, so it is not guarded.
enable_language(CUDA)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
set(ZEROTK_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
# The engine tests (tests/cuda/test_engine*.cu) launch the same kernels that test_kernels.cu and its
# neighbours compile for every architecture above, inside a whole engine that nvcc's device front end
# parses once per architecture (about 40 s each here). A compile check (the cuda-compile preset) builds
# them for one; empty: CMAKE_CUDA_ARCHITECTURES, as every other target.
set(ZEROTK_CUDA_ENGINE_TEST_ARCHITECTURES "" CACHE STRING
    "CUDA architectures of the engine tests (empty: CMAKE_CUDA_ARCHITECTURES)")

if(NOT TARGET zerotk_cuda_all)
  add_custom_target(zerotk_cuda_all)
endif()

function(zerotk_cuda_executable target)
  add_executable(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE zerotk::cuda)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${ZEROTK_CUDA_ARCHITECTURES}")
  # CMake 3.25 does not know nvcc's C++20 flag; pass it directly.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr -Xcompiler=-Wall>)
  add_dependencies(zerotk_cuda_all ${target})
endfunction()

get_property(_zerotk_gpu_checked GLOBAL PROPERTY ZEROTK_GPU_CHECKED SET)
if(NOT _zerotk_gpu_checked)
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _zerotk_smi_rc OUTPUT_VARIABLE _zerotk_smi_out ERROR_QUIET)
  if(_zerotk_smi_rc EQUAL 0 AND _zerotk_smi_out MATCHES "GPU")
    set_property(GLOBAL PROPERTY ZEROTK_GPU_CHECKED ON)
    message(STATUS "zerotk: GPU found, CUDA tests will run: ${_zerotk_smi_out}")
  else()
    set_property(GLOBAL PROPERTY ZEROTK_GPU_CHECKED OFF)
    message(STATUS "zerotk: no usable GPU here: CUDA tests and examples are compiled (sm ${ZEROTK_CUDA_ARCHITECTURES}) but not run")
  endif()
endif()
get_property(ZEROTK_GPU_USABLE GLOBAL PROPERTY ZEROTK_GPU_CHECKED)
