# rlk_write_build_facts(PACKAGE TOOLKIT_VERSION ARCH...): install PACKAGE/_build.py, the facts
# the package's probe reads without loading the extension (see the shared _ext.py). Shared by
# rlk-cuda and rlk-rocm, whose host modules are the same files: what differs is this data.
function(rlk_write_build_facts package toolkit_version)
  set(_quoted "")
  foreach(_arch IN LISTS ARGN)
    string(APPEND _quoted "\"${_arch}\", ")
  endforeach()
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/facts/_build.py"
       "\"\"\"Written by ${package}'s build: what the compiled extension targets.\"\"\"\n\n"
       "ARCHITECTURES = (${_quoted})\n"
       "TOOLKIT_VERSION = \"${toolkit_version}\"\n")
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/facts/_build.py" DESTINATION ${package})
endfunction()
