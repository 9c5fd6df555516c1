// PipeDream profiles (graph.txt), with the defaults (batch 128, measured on v100).
#include "core/models/pipedream_profile.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::fuzz::check(pipegrid::parse_pipedream_profile(pipegrid::fuzz::text_of(data, size), "fuzz/p.txt",
                                                          pipegrid::ProfileOptions{}));
  return 0;
}
