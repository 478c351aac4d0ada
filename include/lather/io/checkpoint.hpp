// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Checkpoint files: a StateDict in a small self-describing little-endian binary format,
/// checked by CRC-32, written atomically (temporary file + rename) and read defensively.
///
/// Format (version 1), all integers little-endian:
///
///     magic        8 bytes  "\x89LATHER\n"
///     version      u32      1
///     format       u32 length + bytes (StateDict::format, e.g. "lather.Adam.v1")
///     count        u64      number of entries
///     count times, in increasing name order (byte-wise), names unique:
///                  u32 name length + name bytes, u8 dtype (1 float32, 2 float64, 3 int64),
///                  u32 rank, rank x i64 shape (each >= 0), numel x element values (row-major)
///     crc32        u32      zlib's CRC-32 of every byte before it
///
/// Every length, count and shape is checked against the bytes that remain before anything is
/// allocated, so a damaged or hostile file is rejected with lather::invalid_argument (naming the
/// file, what is wrong and what to do) and never causes a large allocation or an out-of-bounds
/// read. This is the single-process, dependency-light format (zlib only); distributed
/// checkpoints will be HDF5 (docs/state.md).
#ifndef LATHER_IO_CHECKPOINT_HPP
#define LATHER_IO_CHECKPOINT_HPP

#include <lather/error.hpp>
#include <lather/io/state_dict.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#if __has_include(<unistd.h>) && __has_include(<fcntl.h>)
#include <fcntl.h>
#include <unistd.h>
#define LATHER_IMPL_CHECKPOINT_POSIX 1
#endif

namespace lather {

namespace impl {

inline constexpr std::array<unsigned char, 8> checkpoint_magic{0x89, 'L', 'A', 'T', 'H', 'E', 'R', '\n'};
inline constexpr std::uint32_t checkpoint_version = 1;
/// Smallest possible entry: name length (4), dtype (1), rank (4).
inline constexpr std::size_t checkpoint_min_entry_bytes = 9;
inline constexpr const char* checkpoint_advice =
    "the file is damaged or incomplete (or not a lather checkpoint): restore it from a good copy or "
    "restart from an earlier checkpoint";

/// "(2, 3)", "(4,)", "()".
[[nodiscard]] inline std::string checkpoint_shape(const std::vector<std::int64_t>& shape) {
  std::string r = "(";
  for (std::size_t k = 0; k < shape.size(); ++k) r += (k ? ", " : "") + std::to_string(shape[k]);
  return r + (shape.size() == 1 ? ",)" : ")");
}

/// zlib's CRC-32 of `bytes` (in chunks: zlib takes 32-bit lengths).
[[nodiscard]] inline std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const std::size_t n = std::min<std::size_t>(bytes.size() - pos, std::size_t{1} << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + pos), static_cast<uInt>(n));
    pos += n;
  }
  return static_cast<std::uint32_t>(crc);
}

class CheckpointWriter {
 public:
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    m_out.insert(m_out.end(), b, b + n);
  }
  template <class U>
  void integer(U v) {
    static_assert(std::is_unsigned_v<U>);
    for (std::size_t i = 0; i < sizeof(U); ++i) m_out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
  }
  void string(const std::string& s, const char* what) {
    LATHER_THROW_IF(s.size() > std::numeric_limits<std::uint32_t>::max(), "lather::serialize_state_dict: ", what,
                    " is longer than 4 GiB");
    integer(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  template <class T>
  void values(const std::vector<T>& v) {
    if constexpr (std::endian::native == std::endian::little) {
      bytes(v.data(), v.size() * sizeof(T));
    } else {
      using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      for (const T x : v) integer(std::bit_cast<U>(x));
    }
  }
  [[nodiscard]] std::vector<std::byte>& out() { return m_out; }

 private:
  std::vector<std::byte> m_out;
};

class CheckpointReader {
 public:
  CheckpointReader(std::span<const std::byte> data, std::string_view source) : m_data(data), m_source(source) {}

  [[nodiscard]] std::size_t remaining() const { return m_data.size() - m_pos; }
  [[nodiscard]] std::size_t position() const { return m_pos; }

  /// Throws invalid_argument naming the file when fewer than `n` bytes remain.
  void need(std::size_t n, const std::string& what) const {
    if (n > remaining()) fail("truncated: ", what, " needs ", n, " bytes, ", remaining(), " remain");
  }
  template <class U>
  [[nodiscard]] U integer(const std::string& what) {
    need(sizeof(U), what);
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i)
      v = static_cast<U>(v | (static_cast<U>(std::to_integer<unsigned>(m_data[m_pos + i])) << (8 * i)));
    m_pos += sizeof(U);
    return v;
  }
  [[nodiscard]] std::string string(const std::string& what) {
    const auto n = integer<std::uint32_t>(what + " length");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(m_data.data() + m_pos), n);
    m_pos += n;
    return s;
  }
  /// `n` values of T; the caller has checked that n * sizeof(T) bytes remain.
  template <class T>
  [[nodiscard]] std::vector<T> values(std::size_t n) {
    std::vector<T> v(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n != 0) std::memcpy(v.data(), m_data.data() + m_pos, n * sizeof(T));
      m_pos += n * sizeof(T);
    } else {
      using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      for (auto& x : v) x = std::bit_cast<T>(integer<U>("value"));
    }
    return v;
  }
  void skip(std::size_t n) { m_pos += n; }

  template <class... Args>
  [[noreturn]] void fail(Args&&... args) const {
    impl::throw_error<invalid_argument>(std::source_location::current(), "lather: checkpoint '", m_source, "': ",
                                        std::forward<Args>(args)..., "; ", checkpoint_advice);
  }

 private:
  std::span<const std::byte> m_data;
  std::size_t m_pos = 0;
  std::string_view m_source;
};

/// Parses a checkpoint. `verify_crc = false` skips only the CRC comparison (the fuzz target uses
/// it to reach the structure checks and load_state_dict with mutated contents); every bound is
/// checked either way.
[[nodiscard]] inline StateDict parse_checkpoint(std::span<const std::byte> data, std::string_view source,
                                                bool verify_crc) {
  CheckpointReader in(data, source);
  if (data.size() < checkpoint_magic.size() ||
      !std::equal(checkpoint_magic.begin(), checkpoint_magic.end(), data.begin(),
                  [](unsigned char a, std::byte b) { return a == std::to_integer<unsigned char>(b); }))
    in.fail("not a lather checkpoint (the file does not start with the checkpoint magic bytes \\x89LATHER\\n)");
  in.skip(checkpoint_magic.size());
  const auto version = in.integer<std::uint32_t>("the format version");
  if (version != checkpoint_version)
    in.fail("format version ", version, " is not supported (this lather reads version ", checkpoint_version,
            "; use the lather version that wrote it)");
  StateDict dict;
  dict.format = in.string("the state dictionary format string");
  const auto count = in.integer<std::uint64_t>("the entry count");
  if (count > in.remaining() / checkpoint_min_entry_bytes)
    in.fail("truncated: ", count, " entries need at least ", count * checkpoint_min_entry_bytes, " bytes, ",
            in.remaining(), " remain");
  for (std::uint64_t e = 0; e < count; ++e) {
    const std::string what = "entry " + std::to_string(e);
    std::string name = in.string(what + "'s name");
    const std::string entry = "entry '" + name + "'";
    // Entries are stored in name order (as StateDict's map iterates), so that every dictionary
    // has exactly one encoding: a repeated or out-of-order name is corruption.
    if (!dict.tensors.empty()) {
      const std::string& previous = dict.tensors.rbegin()->first;
      if (name == previous) in.fail("duplicate ", entry);
      if (name < previous) in.fail(entry, " is out of order (it follows '", previous, "'; entries are sorted by name)");
    }
    const auto dtype = in.integer<std::uint8_t>(entry + "'s dtype");
    std::size_t element = 0;
    switch (dtype) {
      case 1: element = 4; break;
      case 2: element = 8; break;
      case 3: element = 8; break;
      default: in.fail(entry, " has unknown dtype code ", unsigned{dtype}, " (1 float32, 2 float64, 3 int64)");
    }
    const auto rank = in.integer<std::uint32_t>(entry + "'s rank");
    if (rank > in.remaining() / 8)
      in.fail("truncated: ", entry, "'s shape of rank ", rank, " needs ", std::uint64_t{rank} * 8, " bytes, ",
              in.remaining(), " remain");
    StateTensor t;
    t.shape.resize(rank);
    // The product of the extents is checked for overflow (a zero extent anywhere makes the entry
    // empty); its byte size is then compared with the bytes that remain, before allocating.
    constexpr std::uint64_t max_numel = std::numeric_limits<std::uint64_t>::max() / 8;
    std::uint64_t numel = 1;
    bool has_zero = false, overflow = false;
    for (std::uint32_t d = 0; d < rank; ++d) {
      const auto extent = static_cast<std::int64_t>(in.integer<std::uint64_t>(entry + "'s shape"));
      if (extent < 0) in.fail(entry, " has negative extent ", extent, " in dimension ", d);
      t.shape[d] = extent;
      const auto u = static_cast<std::uint64_t>(extent);
      if (u == 0) has_zero = true;
      else if (!overflow && u > max_numel / numel) overflow = true;
      else if (!overflow) numel *= u;
    }
    if (has_zero) numel = 0;
    else if (overflow) in.fail(entry, " has shape ", checkpoint_shape(t.shape), " whose size overflows 64 bits");
    const std::uint64_t bytes = numel * element;
    if (bytes > in.remaining())
      in.fail("truncated: ", entry, " needs ", bytes, " bytes, ", in.remaining(), " remain");
    const auto n = static_cast<std::size_t>(numel);
    if (dtype == 1) t.values = in.values<float>(n);
    else if (dtype == 2) t.values = in.values<double>(n);
    else t.values = in.values<std::int64_t>(n);
    dict.tensors.emplace_hint(dict.tensors.end(), std::move(name), std::move(t));
  }
  if (in.remaining() < 4) in.fail("truncated: the CRC-32 needs 4 bytes, ", in.remaining(), " remain");
  if (in.remaining() > 4)
    in.fail(in.remaining() - 4, " unexpected bytes after the last entry (before the CRC-32)");
  const std::size_t body = in.position();
  const auto stored = in.integer<std::uint32_t>("the CRC-32");
  if (verify_crc) {
    const auto computed = crc32_of(data.first(body));
    if (stored != computed)
      in.fail("CRC-32 mismatch (stored ", stored, ", computed ", computed, "): the contents were changed after saving");
  }
  return dict;
}

}  // namespace impl

/// \brief The checkpoint bytes of `dict` (see the file comment for the format).
/// Throws lather::invalid_argument when an entry's values do not match its shape.
[[nodiscard]] inline std::vector<std::byte> serialize_state_dict(const StateDict& dict) {
  impl::CheckpointWriter w;
  w.bytes(impl::checkpoint_magic.data(), impl::checkpoint_magic.size());
  w.integer(impl::checkpoint_version);
  w.string(dict.format, "the format string");
  w.integer(static_cast<std::uint64_t>(dict.tensors.size()));
  for (const auto& [name, t] : dict.tensors) {
    // The reader's rule: a zero extent anywhere makes the entry empty, whatever the other extents
    // multiply to (a shape (2^40, 2^40, 0) read from a file must write back; fuzz_checkpoint).
    std::uint64_t numel = 1;
    const bool empty = std::find(t.shape.begin(), t.shape.end(), std::int64_t{0}) != t.shape.end();
    for (const auto e : t.shape) {
      LATHER_THROW_IF(e < 0, "lather::serialize_state_dict: entry '", name, "' has negative extent ", e);
      if (empty) continue;
      const auto u = static_cast<std::uint64_t>(e);
      LATHER_THROW_IF(numel > std::numeric_limits<std::uint64_t>::max() / u, "lather::serialize_state_dict: entry '",
                      name, "' has an overflowing shape");
      numel *= u;
    }
    if (empty) numel = 0;
    LATHER_THROW_IF(numel != t.stored_size(), "lather::serialize_state_dict: entry '", name, "' has shape ",
                    impl::checkpoint_shape(t.shape), " but ", t.stored_size(), " values; make them agree");
    w.string(name, "an entry name");
    w.integer(static_cast<std::uint8_t>(t.values.index() + 1));
    w.integer(static_cast<std::uint32_t>(t.shape.size()));
    for (const auto e : t.shape) w.integer(static_cast<std::uint64_t>(e));
    std::visit([&](const auto& v) { w.values(v); }, t.values);
  }
  w.integer(impl::crc32_of(w.out()));
  return std::move(w.out());
}

/// \brief Parses checkpoint bytes; `source_name` names them in error messages (a file name).
/// Throws lather::invalid_argument saying what is wrong for any malformed input.
[[nodiscard]] inline StateDict deserialize_state_dict(std::span<const std::byte> data,
                                                      std::string_view source_name) {
  return impl::parse_checkpoint(data, source_name, true);
}

/// \brief Writes `dict` to `path` atomically: into a temporary file in the same directory,
/// flushed to disk, then renamed over `path`, so a crash never leaves a half-written checkpoint
/// under the real name. Throws lather::runtime_error when the file cannot be written.
inline void save_checkpoint(const std::filesystem::path& path, const StateDict& dict) {
  namespace fs = std::filesystem;
  const std::vector<std::byte> bytes = serialize_state_dict(dict);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  static unsigned counter = 0;
#ifdef LATHER_IMPL_CHECKPOINT_POSIX
  const std::string unique = std::to_string(::getpid()) + "." + std::to_string(++counter);
#else
  const std::string unique = std::to_string(++counter);
#endif
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp-" + unique);
  auto fail = [&](const std::string& what, int err) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    impl::throw_error<runtime_error>(std::source_location::current(), "lather::save_checkpoint: cannot ", what, " '",
                                     tmp.string(), "' for '", path.string(), "': ", std::generic_category().message(err),
                                     "; check that the directory exists, is writable and has space");
  };
#ifdef LATHER_IMPL_CHECKPOINT_POSIX
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC, 0644);
  if (fd < 0) fail("create", errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write", err);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("flush", err);
  }
  if (::close(fd) != 0) fail("close", errno);
#else
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("create", EIO);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) fail("write", EIO);
  }
#endif
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("rename", ec.value());
}

/// \brief Reads a checkpoint written by save_checkpoint. Throws lather::runtime_error when the
/// file cannot be read and lather::invalid_argument (naming the file, what is wrong and what to
/// do) when it is not a complete, intact checkpoint. Give the result to an optimizer's
/// load_state_dict, which checks it against the optimizer before changing anything.
[[nodiscard]] inline StateDict load_checkpoint(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  LATHER_THROW_RUNTIME_IF(!in, "lather::load_checkpoint: cannot open '", path.string(),
                          "'; check the path and its permissions");
  std::vector<std::byte> bytes;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    const auto* b = reinterpret_cast<const std::byte*>(buffer);
    bytes.insert(bytes.end(), b, b + in.gcount());
  }
  LATHER_THROW_RUNTIME_IF(in.bad(), "lather::load_checkpoint: error while reading '", path.string(), "'");
  return deserialize_state_dict(bytes, path.string());
}

}  // namespace lather

#endif
