// SPDX-License-Identifier: Apache-2.0
// Reading gzip-compressed IDX files (the MNIST / Fashion-MNIST format) with zlib. Plain C++: no
// Kokkos here, so the data layer compiles the same on every back end.
//
// IDX: a big-endian header (two zero bytes, a type code, the rank) followed by one big-endian
// uint32 per dimension and the row-major data. Fashion-MNIST uses type 0x08 (unsigned byte):
// images are rank 3 (count, 28, 28), labels rank 1 (count).
#ifndef LATHER_EXAMPLES_FMNIST_IDX_HPP
#define LATHER_EXAMPLES_FMNIST_IDX_HPP

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

/// A decoded IDX file of unsigned bytes.
struct IdxArray {
  std::vector<std::uint32_t> shape;
  std::vector<std::uint8_t> data;
};

/// Thrown for a missing, truncated or malformed data file; the message names the file and what to do.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
class GzFile {
 public:
  explicit GzFile(const std::filesystem::path& path) : m_path(path.string()) {
    m_file = gzopen(m_path.c_str(), "rb");
    if (!m_file) throw DataError("cannot open " + m_path);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(m_file); }

  /// Reads exactly `n` bytes or throws, naming what was being read.
  void read(void* out, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      // gzread takes an unsigned count; read in chunks well below its limit.
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30));
      const int got = gzread(m_file, p, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(m_file, &code);
        throw DataError(m_path + ": corrupt gzip data while reading the " + std::string(what) + " (" + msg +
                        "); download the file again");
      }
      if (got == 0) throw DataError(m_path + ": file ends inside the " + what + " (truncated download?)");
      p += got;
      n -= static_cast<std::size_t>(got);
    }
  }
  /// True when no byte is left (reading past the data also makes zlib check the gzip trailer).
  bool at_end() {
    unsigned char extra = 0;
    const int got = gzread(m_file, &extra, 1);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(m_file, &code);
      throw DataError(m_path + ": corrupt gzip data (" + std::string(msg) + "); download the file again");
    }
    return got == 0;
  }

 private:
  std::string m_path;
  gzFile m_file = nullptr;
};
}  // namespace detail

/// Reads a (gzip-compressed or plain: zlib reads both) IDX file of unsigned bytes, checking the
/// magic number, the rank and that the data is exactly as long as the header says.
inline IdxArray read_idx(const std::filesystem::path& path, std::size_t expected_rank) {
  detail::GzFile file(path);
  unsigned char magic[4];
  file.read(magic, 4, "header");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08)
    throw DataError(path.string() + ": not an IDX file of unsigned bytes (magic " + std::to_string(magic[0]) + " " +
                    std::to_string(magic[1]) + " " + std::to_string(magic[2]) + "; expected 0 0 8)");
  if (magic[3] != expected_rank)
    throw DataError(path.string() + ": IDX rank " + std::to_string(magic[3]) + ", expected " +
                    std::to_string(expected_rank));
  IdxArray out;
  std::size_t total = 1;
  for (std::size_t i = 0; i < expected_rank; ++i) {
    unsigned char b[4];
    file.read(b, 4, "header");
    const std::uint32_t d = (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
    if (d == 0 || d > (1u << 28)) throw DataError(path.string() + ": implausible dimension " + std::to_string(d));
    out.shape.push_back(d);
    total *= d;
  }
  out.data.resize(total);
  file.read(out.data.data(), total, "data");
  if (!file.at_end()) throw DataError(path.string() + ": trailing bytes after the data the header describes");
  return out;
}

/// One split of the data set on the host: pixels in [0, 255] and labels in [0, 9].
struct HostSplit {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count x rows x cols
  std::vector<std::uint8_t> labels;  // count
};

/// Reads `<dir>/<prefix>-images-idx3-ubyte.gz` and `<dir>/<prefix>-labels-idx1-ubyte.gz`
/// (prefix "train" or "t10k") and checks that they agree.
inline HostSplit read_split(const std::filesystem::path& dir, const std::string& prefix) {
  const auto images = dir / (prefix + "-images-idx3-ubyte.gz");
  const auto labels = dir / (prefix + "-labels-idx1-ubyte.gz");
  for (const auto& f : {images, labels})
    if (!std::filesystem::exists(f))
      throw DataError("missing " + f.string() +
                      ": install Debian's dataset-fashion-mnist package (scripts/setup-deps.sh does) or pass "
                      "--data-dir with the four Fashion-MNIST .gz files");
  auto x = read_idx(images, 3);
  auto y = read_idx(labels, 1);
  if (x.shape[0] != y.shape[0])
    throw DataError(images.string() + " has " + std::to_string(x.shape[0]) + " images but " + labels.string() +
                    " has " + std::to_string(y.shape[0]) + " labels");
  for (std::size_t i = 0; i < y.data.size(); ++i)
    if (y.data[i] > 9)
      throw DataError(labels.string() + ": label " + std::to_string(y.data[i]) + " at index " + std::to_string(i) +
                      " is outside 0..9");
  HostSplit s;
  s.count = x.shape[0];
  s.rows = x.shape[1];
  s.cols = x.shape[2];
  s.pixels = std::move(x.data);
  s.labels = std::move(y.data);
  return s;
}

}  // namespace fmnist

#endif
