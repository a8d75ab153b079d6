# Runs two commands that must train alike: both exit 0 and print the same sequence of progress-line
# losses ("loss <number>", at least two) and the same final line matching FINAL.
#   cmake -DA="prog;args" -DB="prog;args" -DFINAL=regex -P same_losses.cmake
foreach(run A B)
  execute_process(COMMAND ${${run}} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run ${run} exited ${rc}:\n${out}${err}")
  endif()
  string(REGEX MATCHALL "loss [0-9.]+" losses_${run} "${out}")
  string(REGEX MATCH "${FINAL}" final_${run} "${out}")
  list(LENGTH losses_${run} n)
  if(n LESS 2 OR final_${run} STREQUAL "")
    message(FATAL_ERROR "run ${run} printed ${n} losses and no line matching '${FINAL}':\n${out}")
  endif()
endforeach()
if(NOT losses_A STREQUAL losses_B OR NOT final_A STREQUAL final_B)
  message(FATAL_ERROR "the runs differ:\n A: ${losses_A} | ${final_A}\n B: ${losses_B} | ${final_B}")
endif()
message(STATUS "equal: ${losses_A} | ${final_A}")
