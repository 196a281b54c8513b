# logitd_git_revision(OUT DIR): the short (12-digit) revision of the git
# checkout at DIR, with "-dirty" when tracked files differ from it; empty
# outside a checkout. Shared by the build id (LogitdBuildId.cmake) and the
# test that reads it back (tests/integration/check_build_id.cmake).
function(logitd_git_revision out dir)
  execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${dir}"
                  OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE failed ERROR_QUIET)
  if(failed OR NOT rev)
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${dir}"
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND rev "-dirty")
  endif()
  set(${out} "${rev}" PARENT_SCOPE)
endfunction()
