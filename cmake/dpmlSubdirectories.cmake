# dpml_add_subdirectories(): add every sub-folder of the current source folder that has a
# CMakeLists.txt (examples/, bench/ and tests/ hold one program or topic per folder).
include_guard(GLOBAL)
function(dpml_add_subdirectories)
  file(GLOB dirs LIST_DIRECTORIES true CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(d IN LISTS dirs)
    if(IS_DIRECTORY ${d} AND EXISTS ${d}/CMakeLists.txt)
      add_subdirectory(${d})
    endif()
  endforeach()
endfunction()
