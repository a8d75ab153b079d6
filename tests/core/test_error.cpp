#include "test.hpp"

#include <dpml/core/error.hpp>

#include <string>

using namespace dpml;

TEST_CASE("error: message, rank and location", "[error]") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    DPML_REQUIRE(1 + 1 == 3, "arithmetic is broken: " << 42);
    FAIL("DPML_REQUIRE did not throw");
  } catch (const Error& e) {
    CHECK(e.message() == "arithmetic is broken: 42");
    CHECK(e.rank() == rank);
    CHECK(e.scope() == Scope::local);
    CHECK(std::string(e.where().file_name()).find("test_error.cpp") != std::string::npos);
    CHECK(std::string(e.what()).find("rank " + std::to_string(rank)) != std::string::npos);
  }
}

TEST_CASE("error: checked MPI call names the call and MPI's text", "[error]") {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  try {
    DPML_CHECK_MPI(MPI_Send(nullptr, -1, MPI_INT, 0, 0, MPI_COMM_WORLD));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.message().find("MPI_Send") != std::string::npos);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

TEST_CASE("status: ok, failure, raise", "[error]") {
  Status ok;
  CHECK(ok.ok());
  auto bad = Status::failure("bad thing");
  CHECK_FALSE(bad.ok());
  CHECK(bad.message() == "bad thing");
  CHECK_THROWS_AS(bad.throw_if_error(), Error);
  CHECK_NOTHROW(ok.throw_if_error());
}
