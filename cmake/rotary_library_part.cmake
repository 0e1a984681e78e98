# Parts of the shared libraries: their readers (and what the readers need: settings, files, validation), which call
# no kernel and no torch, compiled once into a static library of their own that the shared library holds whole and
# exports. The fuzz build (ROTARY_FUZZ, scripts/fuzz.sh, docs/fuzzing.md) links the parts alone, so it compiles the
# readers under the sanitizers without the SIMD kernels or torch.
include_guard(GLOBAL)

# rotary_library_part(<library> <part> [<name>]): every object of the static library <part> is linked into
# <library> (whole archive: exported by it even where nothing in <library> calls it). With <name>, rotary::<name> is
# what a library outside <library> links to call <part>: <library> itself in every build but the fuzz build, so that
# a process holds one copy of each object, and <part> alone in the fuzz build.
#
# The fuzz build builds no <library> (its directories are EXCLUDE_FROM_ALL there): <library> links <part> as any
# static library, since parts that link each other there (rotary_core_memory the core's readers) cannot both be
# whole archives of one library.
function(rotary_library_part library part)
  if(ROTARY_FUZZ)
    target_link_libraries(${library} PRIVATE ${part})
  else()
    target_link_libraries(${library} PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${part}>")
  endif()
  if(ARGC GREATER 2)
    add_library(${part}_link INTERFACE)
    target_link_libraries(${part}_link INTERFACE $<IF:$<BOOL:${ROTARY_FUZZ}>,${part},${library}>)
    add_library(rotary::${ARGV2} ALIAS ${part}_link)
  endif()
endfunction()
