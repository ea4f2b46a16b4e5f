# Runs the compiler on one file that must not compile and checks that the FIRST line holding
# "error" matches REGEX (a user reads the first error; a right message after pages of others does
# not help). Invoked as: cmake -DREGEX=... -DCMD=<compiler|args|...> -P first_error.cmake
string(REPLACE "|" ";" CMD "${CMD}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "compiled, but must not")
endif()
# A regex over the whole output, not a list of its lines: clang's line quotes the failed requirement,
# whose ';' and '[' would split or merge CMake list elements.
string(REGEX MATCH "[^\n]*error[^\n]*" line "${out}${err}")
if(line STREQUAL "")
  message(FATAL_ERROR "no error line in the compiler output")
endif()
if(NOT line MATCHES "${REGEX}")
  message(FATAL_ERROR "first error does not match '${REGEX}':\n${line}")
endif()
message(STATUS "first error names it: ${line}")
