# Runs one fuzzer for a bounded time over a fresh copy of its seed corpus.
# Called by ctest as
#   cmake -DFUZZER=<binary> -DSEED=<seed dir> -DWORK=<copy> -DARGS=<flags>
#         -P run_fuzzer.cmake
# Fails when the fuzzer reports a crash, leak, timeout or out-of-memory
# (libFuzzer then exits non-zero).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(GLOB seeds ${SEED}/*)
if(seeds)
  file(COPY ${seeds} DESTINATION ${WORK})
endif()
execute_process(COMMAND ${FUZZER} ${ARGS} -artifact_prefix=${WORK}- ${WORK}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); reproducer at ${WORK}-*")
endif()
