# Runs the compiler on one file that must not compile and checks that the FIRST line holding
# "error" matches REGEX (a user reads the first error; a right message after pages of others does
# not help). Invoked as: cmake -DREGEX=... -DCMD=<compiler|args|...> -P first_error.cmake
string(REPLACE "|" ";" CMD "${CMD}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "compiled, but must not")
endif()
string(REPLACE "\n" ";" lines "${out}${err}")
foreach(line IN LISTS lines)
  if(line MATCHES "error")
    if(line MATCHES "${REGEX}")
      message(STATUS "first error names it: ${line}")
      return()
    endif()
    message(FATAL_ERROR "first error does not match '${REGEX}':\n${line}")
  endif()
endforeach()
message(FATAL_ERROR "no error line in the compiler output")
