# Driven by CTest (see CMakeLists.txt). Fails with the failing step's output.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}${err}" PARENT_SCOPE)
endfunction()

set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release)
set(consumer "${SOURCE_DIR}/tests/package/consumer")

if(MODE STREQUAL "find_package_torch" OR MODE STREQUAL "add_subdirectory_torch")
  # The torch component, found two ways: find_package(zerotk COMPONENTS torch) against the prefix
  # package.find_package installed (its fixture), or add_subdirectory of this source tree, where
  # Torch's imported targets must be visible in the consumer's scope (issue 57 item 13: "Target
  # torch_cpu not found" at generate time).
  if(MODE STREQUAL "find_package_torch")
    if(NOT EXISTS "${PREFIX}")
      message(FATAL_ERROR "no zerotk install at ${PREFIX} (package.find_package installs it)")
    endif()
    set(from -DCMAKE_PREFIX_PATH=${PREFIX})
  else()
    set(from -DZEROTK_SOURCE_DIR=${SOURCE_DIR} -DZEROTK_CUDA=OFF)
  endif()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer-build" ${common} ${from} -DZEROTK_WANT_COMPONENTS=torch)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build" --target consumer_torch)
  run("${WORK_DIR}/consumer-build/consumer_torch")
  message(STATUS "consumer_torch says: ${last_output}")
  if(NOT last_output MATCHES "zerotk torch: 2 parameters, weight first, has_torch=1")
    message(FATAL_ERROR "unexpected consumer_torch output: ${last_output}")
  endif()
  return()
endif()

if(MODE STREQUAL "find_package_engines")
  # The compiled libraries installed from this build tree (built already: no second build of the
  # engines), then a trainer over AnyEngine (examples/05_any_engine) that finds them as a user would:
  # find_package(zerotk COMPONENTS engines), trains and says PASS.
  run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  foreach(lib zerotk_engines zerotk_runtime)
    file(GLOB_RECURSE found "${WORK_DIR}/prefix/lib*${lib}.a")
    if(NOT found)
      message(FATAL_ERROR "lib${lib}.a was not installed under ${WORK_DIR}/prefix")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer-build" ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DZEROTK_WANT_COMPONENTS=engines
      -DZEROTK_ANY_ENGINE_EXAMPLE=${SOURCE_DIR}/examples/05_any_engine)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build" --target consumer_any)
  run("${WORK_DIR}/consumer-build/consumer_any" "${SOURCE_DIR}/examples/05_any_engine/ds_config.json")
  message(STATUS "consumer_any says: ${last_output}")
  if(NOT last_output MATCHES "engine: Stage<2>, Precision<bf16>" OR NOT last_output MATCHES "PASS")
    message(FATAL_ERROR "unexpected consumer_any output: ${last_output}")
  endif()
  return()
endif()

if(MODE STREQUAL "find_package" OR MODE STREQUAL "missing_component")
  # Install zerotk's headers alone (no tests/examples, no compiled libraries: nothing to build;
  # package.find_package_engines installs those) into a private prefix.
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/zerotk-build" ${common}
      -DZEROTK_BUILD_TESTS=OFF -DZEROTK_BUILD_EXAMPLES=OFF -DZEROTK_BUILD_BENCH=OFF -DZEROTK_CUDA=OFF
      -DZEROTK_RUNTIME=OFF "-DZEROTK_ENGINES="
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/zerotk-build")
  if(MODE STREQUAL "missing_component")
    # Asking for a component that was not installed must fail at configure time with a clear message.
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer-build" ${common}
                    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DZEROTK_WANT_COMPONENTS=cuda
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(rc EQUAL 0)
      message(FATAL_ERROR "find_package(zerotk COMPONENTS cuda) succeeded against a CUDA-less install")
    endif()
    if(NOT "${out}${err}" MATCHES "installed without component 'cuda'")
      message(FATAL_ERROR "missing-component message not found in:\n${out}\n${err}")
    endif()
    message(STATUS "missing component reported as expected")
    return()
  endif()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer-build" ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix "-DZEROTK_WANT_COMPONENTS=${COMPONENTS}")
else()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer-build" ${common}
      -DZEROTK_SOURCE_DIR=${SOURCE_DIR} "-DZEROTK_WANT_COMPONENTS=${COMPONENTS}"
      -DZEROTK_CUDA=OFF)
endif()
run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build")
run("${WORK_DIR}/consumer-build/consumer")
message(STATUS "consumer says: ${last_output}")
if(NOT last_output MATCHES "zerotk 0\\.2\\.0")
  message(FATAL_ERROR "unexpected consumer output: ${last_output}")
endif()
