#pragma once
// Helpers for the checkpoint tests: a temporary directory shared by the ranks of a communicator,
// the reference value of any element of a test tensor, and file surgery (truncate, flip a byte).
#include "test.hpp"

#include <dpml/checkpoint/checkpoint.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace dpml::test {

// A fresh directory, the same on every rank of `comm` (named by rank 0), removed at the end.
class SharedTempDir {
 public:
  explicit SharedTempDir(const comm::Mpi& comm) : comm_(comm.native()) {
    static int counter = 0;
    std::uint64_t id = comm_.rank() == 0 ? (static_cast<std::uint64_t>(::getpid()) << 16) + static_cast<std::uint64_t>(counter) : 0;
    ++counter;
    comm_.broadcast(&id, 1, 0);
    path_ = std::filesystem::temp_directory_path() / ("dpml-test-ckpt-" + std::to_string(id));
    if (comm_.rank() == 0) std::filesystem::create_directories(path_);
    comm_.barrier();
  }
  ~SharedTempDir() {
    try {
      comm_.barrier();
    } catch (...) {
    }
    if (comm_.rank() == 0) std::filesystem::remove_all(path_);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  comm::Mpi comm_;
  std::filesystem::path path_;
};

// The value every test tensor holds at global flat index i (exact in every dtype used).
template <class T>
T reference_value(int tensor_id, std::int64_t i) {
  return static_cast<T>(tensor_id * 1000 + i % 997);
}

// A block of a tensor of global shape `shape` filled with reference values.
template <class T>
std::vector<T> reference_block(int tensor_id, const std::vector<std::int64_t>& shape, const checkpoint::Slice& block) {
  std::vector<T> out;
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> idx(rank);
  for (std::size_t d = 0; d < rank; ++d) idx[d] = block[d].begin;
  if (checkpoint::volume(block) == 0) return out;
  for (;;) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < rank; ++d) flat = flat * shape[d] + idx[d];
    out.push_back(reference_value<T>(tensor_id, flat));
    std::size_t d = rank;
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++idx[d] < block[d].end) break;
      idx[d] = block[d].begin;
    }
  }
}

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline void flip_byte(const std::string& path, std::size_t from_end) {
  auto b = read_bytes(path);
  b.at(b.size() - from_end) ^= 0x10;
  write_bytes(path, b);
}
inline void truncate_by(const std::string& path, std::size_t n) {
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - n);
}
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace dpml::test
