# `logitd --version` names the revision of the source tree the binary was
# built from (cmake/LogitdBuildId.cmake): the checkout's HEAD, with "-dirty"
# exactly when tracked files differ from it. Skipped (exit 77) outside a
# git checkout.
#
#   cmake -DLOGITD=path/to/logitd -DSOURCE_DIR=... -P check_build_id.cmake
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/LogitdGitRevision.cmake")
logitd_git_revision(rev "${SOURCE_DIR}")
if(NOT rev)
  message("not a git checkout: nothing to compare the build id with")
  cmake_language(EXIT 77)
endif()
execute_process(COMMAND "${LOGITD}" --version OUTPUT_VARIABLE version
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE version_failed)
if(version_failed)
  message(FATAL_ERROR "logitd --version failed: ${version_failed}")
endif()
string(FIND "${version}" "(${rev}-" at)
if(at EQUAL -1)
  message(FATAL_ERROR "logitd --version says '${version}'; the checkout is at ${rev}: "
                      "rebuild (the build id is written at build time)")
endif()
message("logitd --version: ${version}")
