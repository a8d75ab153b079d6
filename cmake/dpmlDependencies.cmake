# Host dependencies of dpml::dpml, found the same way by the build and by dpmlConfig.cmake.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

# OpenBLAS gives the host GEMM (cblas_sgemm/dgemm). It is found through pkg-config-free
# find_library/find_path so that consumers need no FindBLAS vendor settings; dpml::blas is the
# one imported target that the rest links.
macro(dpml_find_openblas)
  if(NOT TARGET dpml::blas)
    find_library(DPML_OPENBLAS_LIBRARY NAMES openblas openblas64 PATH_SUFFIXES openblas-pthread)
    find_path(DPML_CBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu)
    if(NOT DPML_OPENBLAS_LIBRARY OR NOT DPML_CBLAS_INCLUDE_DIR)
      message(FATAL_ERROR "dpml needs OpenBLAS (library and cblas.h): "
        "apt-get install libopenblas-dev, or set DPML_OPENBLAS_LIBRARY and DPML_CBLAS_INCLUDE_DIR")
    endif()
    add_library(dpml::blas INTERFACE IMPORTED)
    set_target_properties(dpml::blas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${DPML_OPENBLAS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${DPML_CBLAS_INCLUDE_DIR}")
  endif()
endmacro()

macro(dpml_find_host_dependencies)
  find_dependency(MPI COMPONENTS CXX)
  find_dependency(ZLIB)
  set(THREADS_PREFER_PTHREAD_FLAG ON)
  find_dependency(Threads)
  dpml_find_openblas()
endmacro()
