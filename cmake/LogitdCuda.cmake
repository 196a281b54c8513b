# Decides whether the cuda backend is built. AUTO builds it when nvcc is
# found; the binary still runs without a GPU (the backend then refuses to start
# and --backend=auto falls back to cpu).
set(LOGITD_CUDA_ENABLED OFF)
if(LOGITD_WITH_CUDA STREQUAL "ON" OR LOGITD_WITH_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper machine code plus PTX for anything newer.
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(LOGITD_CUDA_ENABLED ON)
  elseif(LOGITD_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOGITD_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "logitd: cuda backend ${LOGITD_CUDA_ENABLED}")
