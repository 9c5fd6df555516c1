# ctest tools/install: `cmake --install` into a fresh prefix, then the installed pipegrid runs from
# an empty folder (everything it needs at run time is compiled in).
#   cmake -DBUILD_DIR=<build> -P install_test.cmake
string(RANDOM LENGTH 8 suffix)
set(prefix "/tmp/pipegrid-install-${suffix}")
set(elsewhere "${prefix}/elsewhere")
file(MAKE_DIRECTORY "${elsewhere}")

function(check what)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${elsewhere}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE_RECURSE "${prefix}")
    message(FATAL_ERROR "${what}: exit status ${rc}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

check("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/bin/pipegrid")
  file(REMOVE_RECURSE "${prefix}")
  message(FATAL_ERROR "cmake --install did not write ${prefix}/bin/pipegrid")
endif()
check("pipegrid --version" "${prefix}/bin/pipegrid" --version)
check("pipegrid run" "${prefix}/bin/pipegrid" run)
if(NOT out MATCHES "iteration time")
  file(REMOVE_RECURSE "${prefix}")
  message(FATAL_ERROR "pipegrid run printed no iteration time:\n${out}")
endif()
# The catalog and a preset, compiled in.
file(WRITE "${elsewhere}/e.yaml" "workload: {model: vgg16}\ncluster: {preset: dgx-a100-16}\nstrategy: {micro_batch_size: 4, micro_batches: 4, stages: 4}\n")
check("pipegrid run e.yaml (zoo model, preset)" "${prefix}/bin/pipegrid" run e.yaml)
file(REMOVE_RECURSE "${prefix}")
