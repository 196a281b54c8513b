# Unity builds of the product: each library and binary under proto/, core/,
# reference/, wire/, server/ and client/ compiles its C++ units in batches of
# 8, so the heavy headers they share (gRPC, Protobuf and their generated
# stubs, nlohmann/json, Abseil) are parsed and their inline code compiled once
# a batch instead of once a unit: `scripts/demo.sh`'s build of logitd and
# logitctl took 94 s this way against 166 s unit by unit (2 cores). Tests,
# benchmarks and fuzzers build unit by unit. A unit's helpers in its anonymous
# namespace share a batch with its neighbours', so their names must differ.
# LOGITD_UNITY_BUILD=OFF (the asan preset) builds every unit alone, which also
# catches a unit that uses a header it does not include.
option(LOGITD_UNITY_BUILD "Compile the product's libraries and binaries in unity batches" ON)

function(_logitd_unity_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _logitd_unity_targets("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(logitd_unity_build)
  if(NOT LOGITD_UNITY_BUILD)
    return()
  endif()
  foreach(dir proto core reference wire server client)
    _logitd_unity_targets("${PROJECT_SOURCE_DIR}/${dir}" targets)
    foreach(t IN LISTS targets)
      get_target_property(type ${t} TYPE)
      if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
        continue()
      endif()
      # A target with CUDA sources builds unit by unit (CMake 3.31 and later
      # batch .cu files too, and the kernels' files share names in their
      # anonymous namespaces).
      get_target_property(sources ${t} SOURCES)
      set(cuda OFF)
      foreach(src IN LISTS sources)
        if(src MATCHES "\\.(cu|cuh)$")
          set(cuda ON)
        endif()
      endforeach()
      if(NOT cuda)
        set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
      endif()
    endforeach()
  endforeach()
endfunction()
