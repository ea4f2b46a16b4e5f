# Runs TOOL with ARGS ("|"-separated) and checks its exit status and combined output.
#   cmake -DTOOL=... -DARGS=a|b -DEXPECT_RC=1 -DEXPECT_REGEX=... -P run_tool.cmake
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${TOOL} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}\n--- output ---\n${all}")
endif()
string(REGEX MATCH "${EXPECT_REGEX}" _m "${all}")
if(NOT _m)
  message(FATAL_ERROR "output does not match ${EXPECT_REGEX}\n--- output ---\n${all}")
endif()
message(STATUS "ok: exit ${rc}")
