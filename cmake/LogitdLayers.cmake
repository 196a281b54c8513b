# The layers the build enforces: a target of a lower layer must not link,
# directly or through another target, a library of a higher one. Checked at
# configure time, so that a stray target_link_libraries fails the build at
# once instead of being found in a link line later.

# Appends to `out` every target and library `target` links, transitively.
function(logitd_link_closure target out)
  set(seen "${${out}}")
  get_target_property(type ${target} TYPE)
  set(props INTERFACE_LINK_LIBRARIES)
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    list(APPEND props LINK_LIBRARIES)
  endif()
  foreach(prop IN LISTS props)
    get_target_property(libs ${target} ${prop})
    if(NOT libs)
      continue()
    endif()
    foreach(lib IN LISTS libs)
      # $<BUILD_INTERFACE:x> and $<LINK_ONLY:x> name x; other generator
      # expressions are not library names.
      string(REGEX REPLACE "^\\$<(BUILD_INTERFACE|LINK_ONLY):(.*)>$" "\\2" lib "${lib}")
      string(REGEX REPLACE "^\\$<LINK_LIBRARY:[A-Z_]+,(.*)>$" "\\1" lib "${lib}")
      if(lib MATCHES "^\\$<" OR lib IN_LIST seen)
        continue()
      endif()
      list(APPEND seen "${lib}")
      if(TARGET ${lib})
        logitd_link_closure(${lib} seen)
      endif()
    endforeach()
  endforeach()
  set(${out} "${seen}" PARENT_SCOPE)
endfunction()

# FATAL_ERROR when `target` links anything matching `pattern` (a regex).
function(logitd_forbid_links target pattern why)
  if(NOT TARGET ${target})
    return()
  endif()
  set(closure "")
  logitd_link_closure(${target} closure)
  foreach(lib IN LISTS closure)
    if(lib MATCHES "${pattern}")
      message(FATAL_ERROR "${target} links ${lib}: ${why}")
    endif()
  endforeach()
endfunction()

# FATAL_ERROR when a source or header under `folder` (relative to the
# project) includes a header matching `pattern`: every layer's code is
# compiled with the source root on its include path, so a header of a
# higher or sideways layer is reachable by name; this keeps it from being
# used. `extra` lists "file:include" pairs treated as if written (the probe
# of the layer tests).
function(logitd_forbid_includes folder pattern why)
  file(GLOB_RECURSE files "${PROJECT_SOURCE_DIR}/${folder}/*.h" "${PROJECT_SOURCE_DIR}/${folder}/*.cc"
       "${PROJECT_SOURCE_DIR}/${folder}/*.cu" "${PROJECT_SOURCE_DIR}/${folder}/*.cuh")
  set(lines "")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" includes REGEX "^#include [\"<]")
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${f}")
    foreach(line IN LISTS includes)
      list(APPEND lines "${rel}:${line}")
    endforeach()
  endforeach()
  foreach(probe IN LISTS LOGITD_LAYER_PROBE_INCLUDE)
    if(probe MATCHES "^${folder}/")
      string(REPLACE ">" ":#include \"" entry "${probe}")
      list(APPEND lines "${entry}\"")
    endif()
  endforeach()
  foreach(entry IN LISTS lines)
    string(REGEX REPLACE "^([^:]*):#include [\"<]([^\">]*)[\">].*$" "\\2" header "${entry}")
    if(header MATCHES "${pattern}")
      string(REGEX REPLACE ":.*$" "" source "${entry}")
      message(FATAL_ERROR "${source} includes ${header}: ${why}")
    endif()
  endforeach()
endfunction()

# The layers (docs/ARCHITECTURE.md), each rule checked by a configure-time
# test in tests/layers/. LOGITD_LAYER_PROBE ("TARGET>LIBRARY;...") adds
# links and LOGITD_LAYER_PROBE_INCLUDE ("FILE>HEADER;...") includes that
# break them, for those tests.
function(logitd_check_layers)
  foreach(probe IN LISTS LOGITD_LAYER_PROBE)
    string(REPLACE ">" ";" pair "${probe}")
    list(GET pair 0 target)
    list(GET pair 1 library)
    target_link_libraries(${target} PRIVATE ${library})
  endforeach()

  set(wire "logitd_wire|logitd_proto|logitd_oip_proto|logitd_call_proto|gRPC::.*|protobuf::.*")
  set(service "logitd_service.*|logitd_state_dir")
  set(kernels "logitd_kernels.*|logitd_backend|logitd_cuda_.*|logitd_host_pool|logitd_device_health|logitd_algo_cache")
  set(clients "logitd_client|logitd_validate|logitd_connection_flags|logitd_server_info_json|logitd_argv")

  # Core: tensors and numbers, nothing of the wire or of anything above.
  logitd_forbid_links(logitd_core "^(logitd_reference|${wire}|${service}|${kernels}|${clients})$"
                      "the core links nothing of the wire (proto, gRPC) or of any layer above it")
  logitd_forbid_includes(core "^(logitd/reference/|logitd/v1/|logitd/wire/|grpc|google/protobuf|kserve/|server/|client/|logitd/client\\.h)"
                         "the core includes nothing of the wire or of any layer above it")
  # The references beside the core: the core and OpenBLAS only.
  logitd_forbid_links(logitd_reference "^(${wire}|${service}|${kernels}|${clients})$"
                      "the references link the core and OpenBLAS, nothing of the wire or above")
  logitd_forbid_includes(reference "^(logitd/(v1|service)/|logitd/wire/|grpc|google/protobuf|kserve/|server/|client/|logitd/client\\.h)"
                         "the references include the core only, nothing of the wire or above")
  # Kernels: the core, never the wire, the service or a client.
  foreach(target logitd_host_pool logitd_device_health logitd_backend logitd_algo_cache
                 logitd_kernels logitd_kernels_code logitd_cuda_kernels logitd_cuda_backend
                 logitd_cuda_backend_code)
    logitd_forbid_links(${target} "^(${wire}|${service}|${clients})$"
                        "the kernels' layer links logitd_core, never the wire (proto, gRPC)")
  endforeach()
  logitd_forbid_includes(server/kernels "^(logitd/(v1|service)/|logitd/wire/|grpc|google/protobuf|kserve/|server/service/|client/|logitd/client\\.h)"
                         "the kernels include the core and their own headers, never the wire or the service")
  # The wire: the core and the proto, never a server or client layer.
  logitd_forbid_links(logitd_wire "^(${service}|${kernels}|${clients})$"
                      "the wire links the core and the proto, never the server or a client")
  logitd_forbid_includes(wire "^(server/|client/|logitd/client\\.h)"
                         "the wire includes the core and the proto, never the server or a client")
  # The history store: SQLite, libpq and Abseil only, below the service and
  # protocol-neutral.
  logitd_forbid_links(logitd_history "^(${wire}|${service}|${kernels}|${clients})$"
                      "the history store links SQLite and Abseil, nothing of the wire or above")
  logitd_forbid_includes(server/history "^(logitd/(v1|service)/|logitd/wire/|grpc|google/protobuf|kserve/|server/service/|server/kernels/|client/|logitd/client\\.h)"
                         "the history store includes nothing of the wire, the service or the kernels")
  # Inside the service (docs/ARCHITECTURE.md, "Inside the service"): the
  # front doors are peers over the shared state, and below them nothing
  # reaches up; the call core and the state take no protocol's types.
  logitd_forbid_includes(server/service/oip "^server/service/v1/"
                         "the front doors are peers: oip includes nothing of v1")
  logitd_forbid_includes(server/service/v1 "^server/service/oip/"
                         "the front doors are peers: v1 includes nothing of oip")
  logitd_forbid_includes(server/service/shared "^server/service/(v1|oip)/"
                         "the shared state is below the front doors: it includes neither")
  logitd_forbid_includes(server/service/transport "^server/service/(v1|oip|shared)/"
                         "the transport is below the front doors and the shared state")
  logitd_forbid_includes(server/service/call
                         "^(server/service/(v1|oip|shared|transport)/|logitd/(v1|service)/|kserve/|google/protobuf)"
                         "the call core is protocol-neutral: no front door, transport or proto types")
  logitd_forbid_includes(server/service/state
                         "^(server/service/(v1|oip|shared|transport|call)/|logitd/(v1|service)/|kserve/|google/protobuf)"
                         "the state is the service's floor: nothing above it, no proto types")
  # Clients: the wire and the client API, never the service or the kernels.
  foreach(target logitd_client logitd_connection_flags logitd_server_info_json logitd_argv
                 logitd_validate logitctl)
    logitd_forbid_links(${target} "^(${service}|${kernels})$"
                        "a client talks to the service over the wire; it links neither the service nor the kernels")
  endforeach()
  logitd_forbid_includes(client "^server/"
                         "a client talks to the service over the wire; it includes nothing of the server")
endfunction()
