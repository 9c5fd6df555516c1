// Jobs files (pipegrid jobs FILE): the reader of jobs and queues, placements, generators and each
// job's experiment on its view of the cluster.
#include "tests/fuzz/fuzz.h"
#include "tools/input/jobs_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::fuzz::check(
      pipegrid::input::load_jobs_text(pipegrid::fuzz::text_of(data, size), "fuzz/jobs.yaml"));
  return 0;
}
