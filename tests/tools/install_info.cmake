# cmake -DBUILD=<dpml build> -DPREFIX=<scratch prefix> -P install_info.cmake: installs dpml-info
# (its install component) into PREFIX and runs PREFIX/bin/dpml-info --help.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --component dpml-info --prefix ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD} --component dpml-info failed (${rc})")
endif()
execute_process(COMMAND ${PREFIX}/bin/dpml-info --help OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "usage: dpml-info")
  message(FATAL_ERROR "${PREFIX}/bin/dpml-info --help: status ${rc}\n${out}${err}")
endif()
message(STATUS "dpml-info installed and runs: ${PREFIX}/bin/dpml-info")
