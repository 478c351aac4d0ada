// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Distributed checkpoints in one HDF5 file (parallel HDF5 over MPI): every rank's state
/// dictionary entries, each a dataset at the path of its key (`state.3.block_1.adagrad` ->
/// `/state/3/block_1/adagrad`), plus the format and the rank count as attributes. The file reads
/// with standard HDF5 tools (h5dump, h5py). Needs lather configured with parallel HDF5 and MPI
/// (docs/building.md).
///
/// With distributed Shampoo every block has one owner, so the file holds each block once, keyed
/// by parameter and block: it is the consolidated dictionary, and it restores on any rank count
/// (each rank's load_state_dict keeps its own blocks' entries).
#ifndef LATHER_IO_HDF5_CHECKPOINT_HPP
#define LATHER_IO_HDF5_CHECKPOINT_HPP

#include <lather/error.hpp>
#include <lather/io/state_dict.hpp>

#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#ifndef H5_HAVE_PARALLEL
#error "lather/io/hdf5_checkpoint.hpp needs a parallel HDF5 (Debian: libhdf5-openmpi-dev)"
#endif

namespace lather {
namespace impl::h5 {

inline constexpr const char* advice =
    "; the file may be missing, truncated or not a lather checkpoint (check it with h5dump); nothing was changed";

/// Owns an HDF5 identifier (files, groups, datasets, dataspaces, property lists, attributes).
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : m_id(id), m_close(close) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : m_id(o.m_id), m_close(o.m_close) { o.m_id = H5I_INVALID_HID; }
  ~Handle() {
    if (m_id >= 0 && m_close != nullptr) m_close(m_id);
  }
  [[nodiscard]] hid_t get() const noexcept { return m_id; }
  [[nodiscard]] bool valid() const noexcept { return m_id >= 0; }

 private:
  hid_t m_id = H5I_INVALID_HID;
  herr_t (*m_close)(hid_t) = nullptr;
};

/// HDF5's own error printing stays off: lather reports what went wrong.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &m_func, &m_data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, m_func, m_data); }

 private:
  H5E_auto2_t m_func = nullptr;
  void* m_data = nullptr;
};

inline std::string path_of(const std::string& key) {
  std::string p = "/" + key;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}
inline std::string key_of(std::string_view path) {
  std::string k(path.substr(path.front() == '/' ? 1 : 0));
  std::replace(k.begin(), k.end(), '/', '.');
  return k;
}
inline hid_t file_type(std::size_t index) {
  return index == 0 ? H5T_IEEE_F32LE : index == 1 ? H5T_IEEE_F64LE : H5T_STD_I64LE;
}
inline hid_t memory_type(std::size_t index) {
  return index == 0 ? H5T_NATIVE_FLOAT : index == 1 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
}
inline Handle dataspace(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return {H5Screate(H5S_SCALAR), H5Sclose};
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return {H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
}

// One entry's metadata as text: "key\tdtype\tdims...\n".
inline std::string describe_entries(const StateDict& d) {
  std::string s;
  for (const auto& [key, t] : d.tensors) {
    // Appended piece by piece (GCC 12 warns falsely about `key + "\t" + ...`).
    s += key;
    s += '\t';
    s += std::to_string(t.values.index());
    for (auto e : t.shape) {
      s += '\t';
      s += std::to_string(e);
    }
    s += '\n';
  }
  return s;
}

struct EntryMeta {
  std::size_t dtype = 0;
  std::vector<std::int64_t> shape;
  int writer = 0;
};

// Every rank's entry list (all-gathered), with the lowest rank holding each key as its writer.
inline std::map<std::string, EntryMeta> gather_entries(const StateDict& local, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::string mine = describe_entries(local);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size), 0);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  for (int r = 1; r < size; ++r) offsets[static_cast<std::size_t>(r)] = offsets[static_cast<std::size_t>(r - 1)] + lengths[static_cast<std::size_t>(r - 1)];
  std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm);
  std::map<std::string, EntryMeta> out;
  for (int r = 0; r < size; ++r) {
    std::string_view part(all.data() + offsets[static_cast<std::size_t>(r)], static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
    while (!part.empty()) {
      const auto eol = part.find('\n');
      std::string_view line = part.substr(0, eol);
      part.remove_prefix(eol + 1);
      std::vector<std::string> fields;
      for (std::size_t at = 0;;) {
        const auto tab = line.find('\t', at);
        fields.emplace_back(line.substr(at, tab == std::string_view::npos ? std::string_view::npos : tab - at));
        if (tab == std::string_view::npos) break;
        at = tab + 1;
      }
      EntryMeta m;
      m.dtype = std::stoul(fields[1]);
      for (std::size_t k = 2; k < fields.size(); ++k) m.shape.push_back(std::stoll(fields[k]));
      m.writer = r;
      auto [it, inserted] = out.emplace(fields[0], m);
      LATHER_THROW_IF(!inserted && (it->second.dtype != m.dtype || it->second.shape != m.shape),
                      "lather::save_distributed_checkpoint: ranks ", it->second.writer, " and ", r, " hold entry '",
                      fields[0], "' with different dtypes or shapes; every rank must save the same optimizer");
    }
  }
  return out;
}

}  // namespace impl::h5

/// \brief Writes every rank's `local` state dictionary into one HDF5 file at `path`
/// (collective over `comm`). Entries held by several ranks (the groups' step, lr, options) are
/// written once, by the lowest rank; the same key must then have the same dtype and shape
/// everywhere. Written to `path`.tmp and renamed when complete, so a failed save leaves an
/// existing checkpoint as it was. `parameter_names` (the same on every rank; optional) become a
/// "name" attribute of each `/state/<i>` group, so tools show which parameter a block belongs to.
inline void save_distributed_checkpoint(const std::filesystem::path& path, const StateDict& local, MPI_Comm comm,
                                        const std::vector<std::string>& parameter_names = {}) {
  using impl::h5::Handle;
  const impl::h5::QuietErrors quiet;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto entries = impl::h5::gather_entries(local, comm);
  const std::filesystem::path tmp = path.string() + ".tmp";
  const std::string where = "lather::save_distributed_checkpoint: " + path.string() + ": ";
  bool ok = true;
  {
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    int created = file.valid() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &created, 1, MPI_INT, MPI_MIN, comm);
    LATHER_THROW_RUNTIME_IF(created == 0, where, "cannot create ", tmp.string(),
                            " (does the directory exist and is it writable on every rank?)");
    Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    // Attributes and datasets are created collectively (the same calls on every rank), then
    // each rank writes the entries it is the writer of, independently.
    auto string_attribute = [&](const char* name, const std::string& value) {
      Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.get(), std::max<std::size_t>(1, value.size()));
      Handle space(H5Screate(H5S_SCALAR), H5Sclose);
      Handle attr(H5Acreate2(file.get(), name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      ok = ok && attr.valid() && H5Awrite(attr.get(), type.get(), value.c_str()) >= 0;
    };
    // Every rank's format must be the same optimizer's.
    string_attribute("lather_format", local.format);
    auto name_attribute = [&](hid_t target, const std::string& value) {
      Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.get(), std::max<std::size_t>(1, value.size()));
      Handle space(H5Screate(H5S_SCALAR), H5Sclose);
      Handle attr(H5Acreate2(target, "name", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      ok = ok && attr.valid() && H5Awrite(attr.get(), type.get(), value.c_str()) >= 0;
    };
    {
      Handle space(H5Screate(H5S_SCALAR), H5Sclose);
      Handle attr(H5Acreate2(file.get(), "lather_ranks", H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      ok = ok && attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_INT, &size) >= 0;
    }
    std::vector<std::pair<const std::string*, Handle>> datasets;
    for (const auto& [key, m] : entries) {
      auto space = impl::h5::dataspace(m.shape);
      Handle ds(H5Dcreate2(file.get(), impl::h5::path_of(key).c_str(), impl::h5::file_type(m.dtype), space.get(),
                           lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
      ok = ok && ds.valid();
      datasets.emplace_back(&key, std::move(ds));
    }
    for (std::size_t i = 0; i < parameter_names.size(); ++i) {
      const std::string group = "/state/" + std::to_string(i);
      if (parameter_names[i].empty() || H5Lexists(file.get(), "/state", H5P_DEFAULT) <= 0 ||
          H5Lexists(file.get(), group.c_str(), H5P_DEFAULT) <= 0)
        continue;
      Handle g(H5Gopen2(file.get(), group.c_str(), H5P_DEFAULT), H5Gclose);
      if (g.valid()) name_attribute(g.get(), parameter_names[i]);
    }
    for (const auto& entry : datasets) {  // no structured binding: captured below (clang -fopenmp)
      const auto& m = entries.at(*entry.first);
      const hid_t ds = entry.second.get();
      if (m.writer != rank || !entry.second.valid()) continue;
      const StateTensor& t = local.tensors.at(*entry.first);
      if (t.stored_size() == 0) continue;
      std::visit([&](const auto& v) {
        ok = ok && H5Dwrite(ds, impl::h5::memory_type(m.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0;
      }, t.values);
    }
  }  // every handle closed (collectively) before the rename
  int good = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &good, 1, MPI_INT, MPI_MIN, comm);
  if (good == 0) {
    if (rank == 0) std::filesystem::remove(tmp);
    impl::throw_error<runtime_error>(std::source_location::current(), where,
                                     "writing the HDF5 file failed on some rank (disk full?); an existing checkpoint "
                                     "at this path is unchanged");
  }
  if (rank == 0) std::filesystem::rename(tmp, path);
  MPI_Barrier(comm);
}

/// \brief Reads a checkpoint written by save_distributed_checkpoint (every entry; each rank's
/// optimizer keeps what it owns in load_state_dict). Collective over `comm` only for opening the
/// file with MPI-IO; a missing, truncated or foreign file is a lather::runtime_error naming it.
inline StateDict load_distributed_checkpoint(const std::filesystem::path& path, MPI_Comm comm) {
  using impl::h5::Handle;
  const impl::h5::QuietErrors quiet;
  const std::string where = "lather::load_distributed_checkpoint: " + path.string() + ": ";
  LATHER_THROW_RUNTIME_IF(!std::filesystem::exists(path), where, "no such file", impl::h5::advice);
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  LATHER_THROW_RUNTIME_IF(!file.valid(), where, "not a readable HDF5 file", impl::h5::advice);
  StateDict d;
  {
    Handle attr(H5Aopen(file.get(), "lather_format", H5P_DEFAULT), H5Aclose);
    LATHER_THROW_RUNTIME_IF(!attr.valid(), where, "no 'lather_format' attribute", impl::h5::advice);
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    const std::size_t n = H5Tget_size(type.get());
    LATHER_THROW_RUNTIME_IF(H5Tget_class(type.get()) != H5T_STRING || n == 0 || n > 4096, where,
                            "'lather_format' is not a string", impl::h5::advice);
    std::string s(n, '\0');
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), n);
    LATHER_THROW_RUNTIME_IF(H5Aread(attr.get(), mem.get(), s.data()) < 0, where, "cannot read 'lather_format'",
                            impl::h5::advice);
    d.format = s.substr(0, s.find('\0'));
  }
  // Every dataset, found by walking the file.
  struct Walk {
    std::vector<std::string> paths;
  } walk;
  const auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type == H5O_TYPE_DATASET) static_cast<Walk*>(data)->paths.emplace_back(name);
    return 0;
  };
#if H5_VERSION_GE(1, 12, 0)
  const herr_t walked = H5Ovisit3(file.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &walk, H5O_INFO_BASIC);
#else
  const herr_t walked = H5Ovisit2(file.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &walk, H5O_INFO_BASIC);
#endif
  LATHER_THROW_RUNTIME_IF(walked < 0, where, "cannot list the datasets", impl::h5::advice);
  for (const auto& p : walk.paths) {
    const std::string key = impl::h5::key_of(p);
    Handle ds(H5Dopen2(file.get(), p.c_str(), H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(ds.get()), H5Sclose);
    Handle type(H5Dget_type(ds.get()), H5Tclose);
    LATHER_THROW_RUNTIME_IF(!ds.valid() || !space.valid() || !type.valid(), where, "cannot open dataset '", p, "'",
                            impl::h5::advice);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    LATHER_THROW_RUNTIME_IF(rank < 0 || rank > 16, where, "dataset '", p, "' has an invalid shape", impl::h5::advice);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    StateTensor t;
    std::size_t n = 1;
    for (auto e : dims) {
      t.shape.push_back(static_cast<std::int64_t>(e));
      n *= static_cast<std::size_t>(e);
    }
    const H5T_class_t cls = H5Tget_class(type.get());
    const std::size_t bytes = H5Tget_size(type.get());
    herr_t rc = 0;
    if (cls == H5T_FLOAT && bytes == 4) {
      std::vector<float> v(n);
      if (n > 0) rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      t.values = std::move(v);
    } else if (cls == H5T_FLOAT && bytes == 8) {
      std::vector<double> v(n);
      if (n > 0) rc = H5Dread(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      t.values = std::move(v);
    } else if (cls == H5T_INTEGER && bytes == 8) {
      std::vector<std::int64_t> v(n);
      if (n > 0) rc = H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      t.values = std::move(v);
    } else {
      impl::throw_error<runtime_error>(std::source_location::current(), where, "dataset '", p,
                                       "' is not float32, float64 or int64", impl::h5::advice);
    }
    LATHER_THROW_RUNTIME_IF(rc < 0, where, "cannot read dataset '", p, "' (truncated file?)", impl::h5::advice);
    d.tensors.emplace(key, std::move(t));
  }
  return d;
}

}  // namespace lather

#endif
