# dpml_link_cuda_or_host(<target> <source…> [GPU_SOURCES <source…>]): a program that offers
# --device cuda where it can. With dpml::cuda (a CUDA compiler was found) nvcc compiles the listed
# sources, which include the device models, GPU_SOURCES are added to the target (code only a GPU
# runs: a program whose host part is plain C++ lists only these), and the target links dpml::cuda;
# without one the listed sources are host C++ against dpml::dpml, GPU_SOURCES are left out and the
# program refuses --device cuda at run time.
include_guard(GLOBAL)
function(dpml_link_cuda_or_host target)
  cmake_parse_arguments(L "" "" "GPU_SOURCES" ${ARGN})
  if(DPML_HAS_CUDA)
    set_source_files_properties(${L_UNPARSED_ARGUMENTS} ${L_GPU_SOURCES} PROPERTIES LANGUAGE CUDA)
    target_sources(${target} PRIVATE ${L_GPU_SOURCES})
    target_link_libraries(${target} PRIVATE dpml::cuda)
    if(L_UNPARSED_ARGUMENTS)  # nvcc compiles code the host runs
      dpml_gpu_compile_check(${target} RUNS_ON_HOST)
    else()
      dpml_gpu_compile_check(${target})
    endif()
  else()
    target_link_libraries(${target} PRIVATE dpml::dpml)
  endif()
endfunction()

# dpml_gpu_compile_check(<target> [RUNS_ON_HOST]): with DPML_GPU_COMPILE_CHECK ON (a build machine
# without a GPU: scripts/test.sh turns it on there) the target's GPU code cannot run here, so it is
# compiled as a check: device code to PTX without optimisation (cicc -O0, no ptxas) and, unless the
# program also runs on the host (RUNS_ON_HOST: an example's --device cpu, a CUDA test of host code),
# its host code at -O0. The front ends see every line as in the real build, in a fraction of the
# time. Call it after the target's CUDA_ARCHITECTURES are set.
function(dpml_gpu_compile_check target)
  cmake_parse_arguments(C "RUNS_ON_HOST" "" "" ${ARGN})
  if(NOT DPML_GPU_COMPILE_CHECK OR NOT DPML_HAS_CUDA)
    return()
  endif()
  get_target_property(archs ${target} CUDA_ARCHITECTURES)
  list(TRANSFORM archs REPLACE "^([0-9]+a?)(-real)?$" "\\1-virtual")
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${archs}")
  # The top-level CMakeLists.txt takes -O out of the Release CUDA flags under this option.
  if(C_RUNS_ON_HOST)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-O3;-Xcicc=-O0>")
  else()
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-O0;-Xcicc=-O0>")
  endif()
endfunction()

# dpml_add_gpu_program(<name> <source…> [ARCHITECTURES <cuda archs>]): a program that runs on GPUs
# only (bench/'s CUDA benchmarks), linked to dpml::cuda; CUDA builds only.
function(dpml_add_gpu_program name)
  cmake_parse_arguments(P "" "" "ARCHITECTURES" ${ARGN})
  add_executable(${name} ${P_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE dpml::cuda)
  if(P_ARCHITECTURES)
    set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${P_ARCHITECTURES}")
  endif()
  dpml_gpu_compile_check(${name})
endfunction()
