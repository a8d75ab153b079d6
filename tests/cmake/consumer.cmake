# Shared by both consumer projects: the program (consumer.cpp) and, when dpml has CUDA,
# consumer_gpu (consumer_gpu.cu: a layer of the consumer's own with its own CUDA kernels, trained
# by dpml on GPUs; compiled with dpml::cuda, run by tests/cmake/CMakeLists.txt where a GPU exists).
# Included after dpml::dpml exists.
add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(consumer PRIVATE dpml::dpml)
if(CONSUMER_CUDA)
  if(NOT TARGET dpml::cuda)
    message(FATAL_ERROR "dpml was built with CUDA, but this consumer sees no dpml::cuda")
  endif()
  add_executable(consumer_gpu ${CMAKE_CURRENT_LIST_DIR}/consumer_gpu.cu)
  target_link_libraries(consumer_gpu PRIVATE dpml::cuda)
endif()
