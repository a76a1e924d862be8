# Runs MPIRUN PROGRAM MODE and passes when it fails (exit status != 0) within MAX_SECONDS with
# stdout+stderr matching EXPECT. Used by the dist_* failure tests (tests/distributed/CMakeLists.txt).
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIRUN} ${PROGRAM} ${MODE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message(STATUS "exit status: ${rc}, ${elapsed} s\n--- stdout ---\n${out}\n--- stderr ---\n${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "${MODE}: still running after ${MAX_SECONDS} s (a rank hangs)")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${MODE}: expected a failing exit status, got 0")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${MODE}: the output does not match '${EXPECT}'")
endif()
