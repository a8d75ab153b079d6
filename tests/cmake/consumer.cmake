# Shared by both consumer projects: the program (consumer.cpp) and, when dpml has CUDA, a .cu
# object (consumer.cu) compiled with dpml::cuda. Included after dpml::dpml exists.
add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(consumer PRIVATE dpml::dpml)
if(CONSUMER_CUDA)
  if(NOT TARGET dpml::cuda)
    message(FATAL_ERROR "dpml was built with CUDA, but this consumer sees no dpml::cuda")
  endif()
  add_library(consumer_cuda OBJECT ${CMAKE_CURRENT_LIST_DIR}/consumer.cu)
  target_link_libraries(consumer_cuda PRIVATE dpml::cuda)
endif()
