# CUDA support of dpml::cuda, shared by the build tree and dpmlConfig.cmake.
#
# * dpml_cuda_cxx20_shim(): CMake before 3.26 does not know C++20 for CUDA ("CUDA20 ... does not
#   know the flags"); it must run after enable_language(CUDA) in every scope that compiles .cu
#   files that use dpml, so dpmlConfig.cmake and FetchContent consumers run it too.
# * dpml_find_cuda_dependencies(): CUDAToolkit plus NCCL, which has no CUDA:: target, as dpml::nccl;
#   and cuDNN, optional: where libcudnn and cudnn.h are found, the target dpml::cudnn and
#   DPML_HAS_CUDNN ON (kernels/cuda/conv/cudnn.hpp needs them), else DPML_HAS_CUDNN OFF.
include_guard(GLOBAL)

macro(dpml_cuda_cxx20_shim)
  if(CMAKE_CUDA_COMPILER_LOADED AND NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
endmacro()

macro(dpml_cuda_cxx20_shim_to_parent)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "${CMAKE_CUDA20_STANDARD_COMPILE_OPTION}" PARENT_SCOPE)
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "${CMAKE_CUDA20_EXTENSION_COMPILE_OPTION}" PARENT_SCOPE)
  set(CMAKE_CUDA_COMPILE_FEATURES "${CMAKE_CUDA_COMPILE_FEATURES}" PARENT_SCOPE)
endmacro()

macro(dpml_find_cuda_dependencies)
  find_package(CUDAToolkit REQUIRED)
  if(NOT TARGET dpml::nccl)
    find_library(DPML_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
    find_path(DPML_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
    if(NOT DPML_NCCL_LIBRARY OR NOT DPML_NCCL_INCLUDE_DIR)
      message(FATAL_ERROR "dpml::cuda needs NCCL (libnccl and nccl.h); set DPML_NCCL_LIBRARY/DPML_NCCL_INCLUDE_DIR or NCCL_HOME")
    endif()
    add_library(dpml::nccl INTERFACE IMPORTED)
    set_target_properties(dpml::nccl PROPERTIES
      INTERFACE_LINK_LIBRARIES "${DPML_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${DPML_NCCL_INCLUDE_DIR}")
  endif()
  if(NOT TARGET dpml::cudnn)
    find_library(DPML_CUDNN_LIBRARY NAMES cudnn
      HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_HOME ENV CUDNN_PATH PATH_SUFFIXES lib lib64)
    find_path(DPML_CUDNN_INCLUDE_DIR NAMES cudnn.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_HOME ENV CUDNN_PATH PATH_SUFFIXES include)
    if(DPML_CUDNN_LIBRARY AND DPML_CUDNN_INCLUDE_DIR)
      add_library(dpml::cudnn INTERFACE IMPORTED)
      set_target_properties(dpml::cudnn PROPERTIES
        INTERFACE_LINK_LIBRARIES "${DPML_CUDNN_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${DPML_CUDNN_INCLUDE_DIR}")
    endif()
  endif()
  if(TARGET dpml::cudnn)
    set(DPML_HAS_CUDNN ON)
  else()
    set(DPML_HAS_CUDNN OFF)
  endif()
endmacro()
