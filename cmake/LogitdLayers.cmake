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
