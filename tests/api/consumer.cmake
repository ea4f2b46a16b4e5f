# Compiles one old-API consumer, checks its deprecation warnings, runs it (tests/api/CMakeLists.txt).
#   cmake -DCXX=... -DFLAGS=a|b|... -DSOURCE=... -DWARNINGS=re1|re2|... -DWORK=<dir> -P consumer.cmake
string(REPLACE "|" ";" FLAGS "${FLAGS}")
string(REPLACE "|" ";" WARNINGS "${WARNINGS}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/scratch")

execute_process(COMMAND ${CXX} ${FLAGS} "${SOURCE}" -o "${WORK}/consumer"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the old-API consumer no longer compiles (${SOURCE}):\n${out}${err}")
endif()
# -fdiagnostics-plain-output is GCC 11+ only; strip quotes of either kind so the regexes stay simple.
string(REGEX REPLACE "[‘’'`\"]" "" diag "${out}${err}")
foreach(re IN LISTS WARNINGS)
  if(NOT diag MATCHES "${re}")
    message(FATAL_ERROR "no compiler warning matches '${re}': the deprecated name must say what replaces it. Output:\n${out}${err}")
  endif()
endforeach()

execute_process(COMMAND "${WORK}/consumer" "${WORK}/scratch" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the old-API consumer compiled but behaves differently (exit ${rc}):\n${out}${err}")
endif()
message(STATUS "${out}")
