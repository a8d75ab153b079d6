// A program that points every rank at a bad IDX pair (argv[1], argv[2]): each rank finds the
// error by itself and exits non-zero; the file is named once (checked by expect_failure.cmake).
#include <dpml/comm/launch.hpp>
#include <dpml/data/image.hpp>

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    DPML_REQUIRE_EVERYWHERE(argc == 3, "usage: test_idx_bad_file IMAGES LABELS");
    const auto ds = dpml::data::ImageDataset::from_idx(argv[1], argv[2]);
    world.barrier();  // never reached with a bad file: no rank may wait here
    return ds.size() > 0 ? 0 : 1;
  });
}
