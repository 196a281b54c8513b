# Run by CTest (install_consumer): installs the logitd build tree into a
# scratch prefix, then configures, builds and runs tests/install_consumer
# against that prefix only. Inputs: LOGITD_BUILD_DIR, CONSUMER_SOURCE_DIR,
# WORK_DIR, GENERATOR, BUILD_TYPE.
foreach(var LOGITD_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("cmake --install" ${CMAKE_COMMAND} --install "${LOGITD_BUILD_DIR}" --prefix "${prefix}"
         --config "${BUILD_TYPE}")
run_step("configure the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${build}"
         -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_PREFIX_PATH=${prefix}")
run_step("build the consumer" ${CMAKE_COMMAND} --build "${build}")
run_step("run the consumer" "${build}/consumer")
if(NOT step_output MATCHES "dtype bf16")
  message(FATAL_ERROR "unexpected consumer output: ${step_output}")
endif()
message(STATUS "install consumer: ${step_output}")
