# CTest driver of one consumer project (tests/cmake/CMakeLists.txt registers it twice):
#   cmake -DMODE=subdirectory|find_package -DDPML_ROOT=<dpml source> -DDPML_BUILD=<dpml build>
#         -DWORK=<scratch dir> -DSETTINGS=<settings.cmake> -P run_consumer.cmake
# find_package first installs the dpml build into WORK/prefix. Then the consumer in
# tests/cmake/<MODE> is configured from scratch with the dpml build's settings (SETTINGS: generator,
# compilers, CUDA, MPIEXEC_*, library hints), built, and run under mpiexec -n 2. Any failing step
# fails the test (a failed configure does not stop `cmake --build` by itself).
include(${SETTINGS})   # GENERATOR, MPIEXEC_*, … (also the consumer's initial cache)

function(step what)
  message(STATUS "consumer_${MODE}: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_${MODE}: ${what} failed (${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(init ${WORK}/init.cmake)
file(COPY ${SETTINGS} DESTINATION ${WORK})
cmake_path(GET SETTINGS FILENAME settings_name)
file(RENAME ${WORK}/${settings_name} ${init})

if(MODE STREQUAL "find_package")
  step("install dpml into ${WORK}/prefix" ${CMAKE_COMMAND} --install ${DPML_BUILD} --prefix ${WORK}/prefix)
  file(APPEND ${init} "set(CMAKE_PREFIX_PATH [==[${WORK}/prefix]==] CACHE PATH \"\")\n")
elseif(MODE STREQUAL "subdirectory")
  file(APPEND ${init} "set(DPML_ROOT [==[${DPML_ROOT}]==] CACHE PATH \"\")\n")
else()
  message(FATAL_ERROR "MODE must be subdirectory or find_package, not '${MODE}'")
endif()

step("configure" ${CMAKE_COMMAND} -G ${GENERATOR} -C ${init} -S ${DPML_ROOT}/tests/cmake/${MODE} -B ${WORK}/build)
step("build" ${CMAKE_COMMAND} --build ${WORK}/build)
step("run under mpiexec -n 2"
  ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS} ${WORK}/build/consumer ${MPIEXEC_POSTFLAGS})
