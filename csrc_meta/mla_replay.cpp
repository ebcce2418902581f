// Eager calls at the cost of a launch: the recorded launches of torch.ops.mla.*, replayed below
// Python.
//
// The ops' device kernels are Python (mla_ops.fastpath records what Triton's dispatch launched
// for a call). This file adds a BackendSelect kernel to every op, which runs before the device
// kernel: it keys the call on its geometry (per argument: a tensor's dtype, device, shape,
// strides, address modulo 64 and which earlier argument is the same tensor; any other
// argument's value) and, for a key seen before, launches the recorded kernels itself with
// cuLaunchKernelEx: the call's tensor addresses patched into the recorded parameter buffers,
// TMA descriptors encoded once per base address. A key not seen goes on to the device kernel
// (the Python path), which commits its record here (`_C.commit`) while this call is pending.
//
// The CUDA driver is loaded at run time (dlopen of libcuda.so.1) and its few types are declared
// here: the build needs no CUDA toolkit, and a CPU machine never reaches the driver.
// Python decides when replays may run (`_C.set_state`): checked mode, a triton other than the
// checked one, and MLA_OPS_TRITON_DISPATCH=1 turn them off; so do Triton's launch hooks while
// any is set (a profiler's), which this file reads from their lists on every call.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mla_replay {
namespace {

// --- the CUDA driver, declared here ---------------------------------------------------------

using CUresult = int;
struct LaunchAttribute {  // CUlaunchAttribute
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value;
  } v;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
struct LaunchConfig {  // CUlaunchConfig
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  void* stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
constexpr int kAttrCooperative = 2;  // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
constexpr int kAttrPDL = 6;          // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
constexpr size_t kTmapBytes = 128;   // sizeof(CUtensorMap)
constexpr int kInterleaveNone = 0, kL2Promotion128B = 2;

struct Driver {
  CUresult (*launch)(const LaunchConfig*, void*, void**, void**) = nullptr;
  CUresult (*encode_tiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                           const unsigned*, const unsigned*, int, int, int, int) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*ctx_get_current)(void**) = nullptr;
  CUresult (*ctx_set_current)(void*) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*primary_ctx_retain)(void**, int) = nullptr;
  std::string why;  // empty when loaded
};

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      r.why = "libcuda.so.1 does not load";
      return r;
    }
    r.launch = reinterpret_cast<decltype(r.launch)>(dlsym(lib, "cuLaunchKernelEx"));
    r.encode_tiled = reinterpret_cast<decltype(r.encode_tiled)>(dlsym(lib, "cuTensorMapEncodeTiled"));
    r.error_string = reinterpret_cast<decltype(r.error_string)>(dlsym(lib, "cuGetErrorString"));
    r.ctx_get_current = reinterpret_cast<decltype(r.ctx_get_current)>(dlsym(lib, "cuCtxGetCurrent"));
    r.ctx_set_current = reinterpret_cast<decltype(r.ctx_set_current)>(dlsym(lib, "cuCtxSetCurrent"));
    r.device_get = reinterpret_cast<decltype(r.device_get)>(dlsym(lib, "cuDeviceGet"));
    r.primary_ctx_retain =
        reinterpret_cast<decltype(r.primary_ctx_retain)>(dlsym(lib, "cuDevicePrimaryCtxRetain_v2"));
    if (r.primary_ctx_retain == nullptr) {
      r.primary_ctx_retain =
          reinterpret_cast<decltype(r.primary_ctx_retain)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    }
    if (r.launch == nullptr || r.encode_tiled == nullptr || r.error_string == nullptr ||
        r.ctx_get_current == nullptr || r.ctx_set_current == nullptr || r.device_get == nullptr ||
        r.primary_ctx_retain == nullptr) {
      r.why = "libcuda.so.1 lacks a driver function the replays call";
    }
    return r;
  }();
  return d;
}

[[noreturn]] void driver_error(const char* what, CUresult res) {
  const char* s = nullptr;
  if (driver().error_string != nullptr) driver().error_string(res, &s);
  C10_THROW_ERROR(Error, std::string("mla_ops: ") + what + " failed: " +
                             (s != nullptr ? s : "CUDA error " + std::to_string(res)));
}

// --- records --------------------------------------------------------------------------------

struct Tmap {  // a host TMA descriptor over a call's tensor, as Triton 3.6's launcher encodes it
  int arg = 0, dtype = 0, rank = 0, swizzle = 0, fill = 0;
  std::array<unsigned, 5> box{};
  std::array<uint64_t, 5> dims{}, strides{};  // innermost first; strides in bytes
  size_t offset = 0;                          // in the parameter buffer
  std::vector<std::pair<uintptr_t, std::array<uint64_t, kTmapBytes / 8>>> cache;
};

struct Launch {
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 0, shared_bytes = 0;
  bool pdl = false, cooperative = false;
  std::vector<uint64_t> buffer;  // the parameters as recorded (constants in place)
  std::vector<size_t> offsets;   // of each parameter in it
  std::vector<size_t> sizes;     // and its size
  std::vector<std::pair<size_t, int>> pointers;  // (offset, argument) patched per call
  std::vector<Tmap> tmaps;
  uint64_t scratch_bytes = 0;  // global scratch per program (device-side TMA descriptors)
  size_t scratch_offset = 0;
};

struct Program {
  std::vector<Launch> launches;
  c10::Device device{c10::DeviceType::CPU};
};

struct Pending {
  std::string op, key;
  int64_t epoch;
  c10::Device device;
};

struct LogEntry {  // what a dry run would have launched (tests)
  uintptr_t function;
  unsigned grid[3], block, shared_bytes;
  bool pdl, cooperative;
  std::vector<std::string> params;
};

// Python's switches (set_state) and the records, under one lock.
std::mutex mu;
bool allowed = false;
bool dry_run = false;            // tests: log launches instead of calling the driver
c10::DeviceType replay_type = c10::DeviceType::CUDA;  // tests: CPU
int64_t epoch = 0;
std::vector<PyObject*> hook_lists;  // Triton's launch hook chains (their `calls` lists)
std::unordered_map<std::string, std::unordered_map<std::string, std::shared_ptr<Program>>> stores;
size_t num_records = 0;
constexpr size_t kMaxRecords = 4096;  // as mla_ops.fastpath: then start over
uint64_t hits = 0, misses = 0, commits = 0;
std::vector<LogEntry> dry_log;
std::string dropped_field;  // tests: a key field left out (each mutant must fail a test)
thread_local std::vector<Pending> pending;

const char* kEnvOff = "MLA_OPS_TRITON_DISPATCH";

bool env_off() {
  const char* v = std::getenv(kEnvOff);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

bool hooks_set() {  // a list's size, read without the GIL: a stale read only delays the switch
  for (PyObject* l : hook_lists) {
    if (Py_SIZE(l) != 0) return true;
  }
  return false;
}

template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// The call's geometry (file comment) into `key`, and the device of its first tensor; false
// where a replay cannot serve it (a tensor on another device type, an argument of a kind no
// schema here has).
bool geometry(const c10::IValue* args, size_t n, std::string& key, c10::Device& device) {
  key.clear();
  bool have_device = false;
  const bool d_dtype = dropped_field != "dtype", d_shape = dropped_field != "shape",
             d_strides = dropped_field != "strides", d_align = dropped_field != "alignment",
             d_alias = dropped_field != "aliasing", d_values = dropped_field != "values",
             d_device = dropped_field != "device";
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        key += 'U';
        continue;
      }
      const c10::Device d = t.device();
      if (d.type() != replay_type || !t.has_storage()) return false;
      if (!have_device) device = d, have_device = true;
      key += 'T';
      if (d_dtype) put(key, static_cast<int8_t>(t.scalar_type()));
      if (d_device) put(key, static_cast<int8_t>(d.index()));
      put(key, static_cast<int8_t>(t.dim()));
      if (d_shape) key.append(reinterpret_cast<const char*>(t.sizes().data()), t.dim() * 8);
      if (d_strides) key.append(reinterpret_cast<const char*>(t.strides().data()), t.dim() * 8);
      if (d_align) put(key, static_cast<int8_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 63));
      int8_t first = static_cast<int8_t>(i);
      for (size_t j = 0; j < i; ++j) {
        if (args[j].isTensor() && args[j].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          first = static_cast<int8_t>(j);
          break;
        }
      }
      if (d_alias) put(key, first);
    } else if (v.isNone()) {
      key += 'N';
    } else if (v.isBool()) {
      key += 'B';
      if (d_values) put(key, static_cast<int8_t>(v.toBool()));
    } else if (v.isInt()) {
      key += 'I';
      if (d_values) put(key, v.toInt());
    } else if (v.isDouble()) {
      key += 'D';
      if (d_values) put(key, v.toDouble());
    } else if (v.isIntList()) {
      key += 'L';
      const auto xs = v.toIntList();
      put(key, static_cast<int64_t>(xs.size()));
      for (int64_t x : xs) put(key, x);
    } else {
      return false;
    }
  }
  return have_device;
}

void encode(Tmap& m, uintptr_t base, uint64_t* out) {
  if (dry_run) {  // a stand-in the tests recompute: the base and the recorded recipe
    std::memset(out, 0, kTmapBytes);
    out[0] = base;
    out[1] = static_cast<uint64_t>(m.dtype) | static_cast<uint64_t>(m.rank) << 8 |
             static_cast<uint64_t>(m.swizzle) << 16 | static_cast<uint64_t>(m.fill) << 24;
    for (int i = 0; i < m.rank; ++i) {
      out[2 + i] = m.dims[i];
      out[7 + i] = m.strides[i];
      out[12 + (i >> 1)] |= static_cast<uint64_t>(m.box[i]) << (32 * (i & 1));
    }
    return;
  }
  const Driver& drv = driver();
  if (!drv.why.empty()) C10_THROW_ERROR(Error, "mla_ops: " + drv.why);
  const unsigned element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult res = drv.encode_tiled(out, m.dtype, static_cast<unsigned>(m.rank),
                                        reinterpret_cast<void*>(base), m.dims.data(),
                                        m.strides.data(), m.box.data(), element_strides,
                                        kInterleaveNone, m.swizzle, kL2Promotion128B, m.fill);
  if (res != 0) driver_error("cuTensorMapEncodeTiled", res);
}

constexpr size_t kMaxParams = 256;

void launch(Launch& ln, const c10::IValue* args, void* stream) {
  alignas(128) uint64_t buf[512];
  const size_t words = ln.buffer.size();
  TORCH_CHECK(words <= 512 && ln.offsets.size() <= kMaxParams, "mla_ops: parameter buffer too large");
  std::memcpy(buf, ln.buffer.data(), words * 8);
  char* base = reinterpret_cast<char*>(buf);
  for (const auto& [offset, arg] : ln.pointers) {
    const uint64_t p = reinterpret_cast<uintptr_t>(args[arg].toTensor().data_ptr());
    std::memcpy(base + offset, &p, 8);
  }
  for (Tmap& m : ln.tmaps) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(args[m.arg].toTensor().data_ptr());
    const uint64_t* found = nullptr;
    for (const auto& [a, bytes] : m.cache) {
      if (a == addr) {
        found = bytes.data();
        break;
      }
    }
    if (found == nullptr) {
      if (m.cache.size() >= 64) m.cache.clear();
      m.cache.emplace_back(addr, std::array<uint64_t, kTmapBytes / 8>{});
      encode(m, addr, m.cache.back().second.data());
      found = m.cache.back().second.data();
    }
    std::memcpy(base + m.offset, found, kTmapBytes);
  }
  // As Triton's launcher: scratch from the allocator, on the current stream, for this launch;
  // PyTorch's caching allocator reuses it only for work ordered after it on that stream.
  c10::DataPtr scratch;
  if (ln.scratch_bytes != 0) {
    const uint64_t programs = uint64_t{ln.grid[0]} * ln.grid[1] * ln.grid[2];
    scratch = c10::GetAllocator(replay_type)->allocate(programs * ln.scratch_bytes);
    const uint64_t p = reinterpret_cast<uintptr_t>(scratch.get());
    std::memcpy(base + ln.scratch_offset, &p, 8);
  }
  void* params[kMaxParams];
  for (size_t i = 0; i < ln.offsets.size(); ++i) params[i] = base + ln.offsets[i];
  if (dry_run) {
    LogEntry e{reinterpret_cast<uintptr_t>(ln.function), {ln.grid[0], ln.grid[1], ln.grid[2]},
               ln.block, ln.shared_bytes, ln.pdl, ln.cooperative, {}};
    for (size_t i = 0; i < ln.offsets.size(); ++i) e.params.emplace_back(base + ln.offsets[i], ln.sizes[i]);
    dry_log.push_back(std::move(e));
    return;
  }
  LaunchAttribute attrs[2];
  unsigned num_attrs = 0;
  if (ln.pdl) {
    std::memset(&attrs[num_attrs], 0, sizeof(LaunchAttribute));
    attrs[num_attrs].id = kAttrPDL;
    attrs[num_attrs++].v.value = 1;
  }
  if (ln.cooperative) {
    std::memset(&attrs[num_attrs], 0, sizeof(LaunchAttribute));
    attrs[num_attrs].id = kAttrCooperative;
    attrs[num_attrs++].v.value = 1;
  }
  if (ln.grid[0] * ln.grid[1] * ln.grid[2] == 0) return;  // as Triton's launcher
  LaunchConfig cfg{{ln.grid[0], ln.grid[1], ln.grid[2]}, {ln.block, 1, 1}, ln.shared_bytes,
                   stream, attrs, num_attrs};
  const CUresult res = driver().launch(&cfg, ln.function, params, nullptr);
  if (res != 0) driver_error("cuLaunchKernelEx", res);
}

// As Triton's launcher: a thread that never used the device has no current context; bind the
// device's primary context (the one PyTorch and Triton use).
void bind_context(int index) {
  const Driver& drv = driver();
  void* ctx = nullptr;
  CUresult res = drv.ctx_get_current(&ctx);
  if (res != 0) driver_error("cuCtxGetCurrent", res);
  if (ctx != nullptr) return;
  int dev = 0;
  if ((res = drv.device_get(&dev, index)) != 0) driver_error("cuDeviceGet", res);
  if ((res = drv.primary_ctx_retain(&ctx, dev)) != 0) driver_error("cuDevicePrimaryCtxRetain", res);
  if ((res = drv.ctx_set_current(ctx)) != 0) driver_error("cuCtxSetCurrent", res);
}

// Makes `device` current for the launches (and back), as the Python path's device guard.
struct CurrentDevice {
  const c10::impl::DeviceGuardImplInterface* impl = nullptr;
  c10::Device previous{c10::DeviceType::CPU};
  explicit CurrentDevice(c10::Device d) {
    if (d.type() == c10::DeviceType::CPU) return;
    impl = c10::impl::getDeviceGuardImpl(d.type());
    previous = impl->exchangeDevice(d);
    if (previous == d) impl = nullptr;
  }
  ~CurrentDevice() {
    if (impl != nullptr) impl->uncheckedSetDevice(previous);
  }
};

void replay(Program& p, const c10::IValue* args) {
  void* stream = nullptr;
  CurrentDevice guard(p.device);
  if (p.device.type() != c10::DeviceType::CPU) {
    if (!dry_run && !driver().why.empty()) C10_THROW_ERROR(Error, "mla_ops: " + driver().why);
    const auto* impl = c10::impl::getDeviceGuardImpl(p.device.type());
    stream = impl->getStreamNativeHandle(impl->getStream(p.device));
    if (!dry_run) bind_context(p.device.index());
  }
  for (Launch& ln : p.launches) launch(ln, args, stream);
}

// The BackendSelect kernel of every mla op (file comment).
void replay_or_redispatch(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  static const c10::DispatchKeySet after_backend_select(c10::DispatchKeySet::FULL_AFTER,
                                                        c10::DispatchKey::BackendSelect);
  const size_t n = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + stack->size() - n;
  thread_local std::string key;
  c10::Device device{c10::DeviceType::CPU};
  bool miss = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (allowed && !env_off() && !hooks_set() && geometry(args, n, key, device)) {
      auto store = stores.find(op.schema().name());
      if (store != stores.end()) {
        auto found = store->second.find(key);
        if (found != store->second.end()) {
          ++hits;
          replay(*found->second, args);
          torch::jit::drop(*stack, n);
          return;
        }
      }
      ++misses;
      miss = true;
      pending.push_back({op.schema().name(), key, epoch, device});
    }
  }
  if (!miss) {
    op.redispatchBoxed(ks & after_backend_select, stack);
    return;
  }
  struct Pop {
    ~Pop() { pending.pop_back(); }
  } pop;
  op.redispatchBoxed(ks & after_backend_select, stack);
}

void impl_backend_select(torch::Library& m, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&replay_or_redispatch>());
  }
}

// --- the Python module's functions ----------------------------------------------------------

bool as_u64(PyObject* o, uint64_t& out) {
  out = PyLong_AsUnsignedLongLongMask(o);
  return !(out == static_cast<uint64_t>(-1) && PyErr_Occurred());
}

// A launch: (function, gx, gy, gz, block, shared_bytes, pdl, cooperative, params), params a
// list of (0, arg) a tensor's address | (1, size, bits) a constant | (2, arg, dtype, swizzle,
// fill, elem_size, box, shape, strides) a TMA descriptor (outermost first, strides in elements)
// | (3, bytes) the address of global scratch, ``bytes`` per program.
bool parse_launch(PyObject* t, Launch& ln) {
  PyObject* params = nullptr;
  unsigned long long fn = 0;
  int pdl = 0, coop = 0;
  if (!PyArg_ParseTuple(t, "KIIIIIppO!", &fn, &ln.grid[0], &ln.grid[1], &ln.grid[2], &ln.block,
                        &ln.shared_bytes, &pdl, &coop, &PyList_Type, &params)) {
    return false;
  }
  ln.function = reinterpret_cast<void*>(static_cast<uintptr_t>(fn));
  ln.pdl = pdl != 0;
  ln.cooperative = coop != 0;
  size_t offset = 0;
  std::vector<std::pair<size_t, size_t>> sizes;
  const Py_ssize_t n = PyList_GET_SIZE(params);
  if (static_cast<size_t>(n) > kMaxParams) {
    PyErr_SetString(PyExc_ValueError, "too many kernel parameters");
    return false;
  }
  std::vector<uint64_t> values;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* p = PyList_GET_ITEM(params, i);
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) < 2) {
      PyErr_SetString(PyExc_TypeError, "a parameter is a tuple (kind, ...)");
      return false;
    }
    const long kind = PyLong_AsLong(PyTuple_GET_ITEM(p, 0));
    size_t size = 8, align = 8;
    uint64_t bits = 0;
    if (kind == 0) {
      ln.pointers.emplace_back(0, static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(p, 1))));
    } else if (kind == 1) {
      size = align = PyLong_AsSize_t(PyTuple_GET_ITEM(p, 1));
      if (PyTuple_GET_SIZE(p) != 3 || !as_u64(PyTuple_GET_ITEM(p, 2), bits) ||
          !(size == 1 || size == 2 || size == 4 || size == 8)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a constant is (1, size, bits)");
        return false;
      }
    } else if (kind == 2) {
      Tmap m;
      PyObject *box, *shape, *strides;
      int elem_size = 0;
      long kind_again = 0;
      if (!PyArg_ParseTuple(p, "liiiiiOOO", &kind_again, &m.arg, &m.dtype, &m.swizzle, &m.fill,
                            &elem_size, &box, &shape, &strides)) {
        return false;
      }
      const Py_ssize_t rank = PySequence_Size(box);
      if (rank < 1 || rank > 5 || PySequence_Size(shape) != rank || PySequence_Size(strides) != rank) {
        PyErr_SetString(PyExc_ValueError, "a TMA descriptor of rank 1 to 5");
        return false;
      }
      m.rank = static_cast<int>(rank);
      // As Triton 3.6's fill_tma_descriptor: innermost first, strides in bytes.
      for (Py_ssize_t j = 0; j < rank; ++j) {
        PyObject* b = PySequence_GetItem(box, j);
        PyObject* s = PySequence_GetItem(shape, j);
        m.box[rank - j - 1] = static_cast<unsigned>(PyLong_AsLong(b));
        m.dims[rank - j - 1] = static_cast<uint64_t>(PyLong_AsLongLong(s));
        Py_XDECREF(b);
        Py_XDECREF(s);
      }
      for (Py_ssize_t j = 0; j + 1 < rank; ++j) {
        PyObject* s = PySequence_GetItem(strides, j);
        m.strides[rank - j - 2] = static_cast<uint64_t>(elem_size) * PyLong_AsLongLong(s);
        Py_XDECREF(s);
      }
      m.strides[rank - 1] = m.dims[rank - 1] * (rank == 1 ? elem_size : m.strides[rank - 2]);
      if (PyErr_Occurred()) return false;
      size = kTmapBytes;
      align = 64;
      offset = (offset + align - 1) / align * align;
      m.offset = offset;
      ln.tmaps.push_back(std::move(m));
    } else if (kind == 3) {
      if (!as_u64(PyTuple_GET_ITEM(p, 1), ln.scratch_bytes)) return false;
    } else {
      PyErr_SetString(PyExc_ValueError, "a parameter kind is 0, 1, 2 or 3");
      return false;
    }
    if (PyErr_Occurred()) return false;
    offset = (offset + align - 1) / align * align;
    if (kind == 0) ln.pointers.back().first = offset;
    if (kind == 3) ln.scratch_offset = offset;
    ln.offsets.push_back(offset);
    ln.sizes.push_back(size);
    if (kind == 1) sizes.emplace_back(offset, size), values.push_back(bits);
    offset += size;
  }
  ln.buffer.assign((offset + 7) / 8, 0);
  char* base = reinterpret_cast<char*>(ln.buffer.data());
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::memcpy(base + sizes[i].first, &values[i], sizes[i].second);  // little-endian
  }
  if (ln.buffer.size() > 512) {
    PyErr_SetString(PyExc_ValueError, "kernel parameters over 4 KiB");
    return false;
  }
  return true;
}

// commit(op, launches) -> bool: store the record of the pending call of `op` (its key was
// computed by the BackendSelect kernel that missed); False when no such call is pending (a
// call that did not come through the dispatcher, or the records were cleared meanwhile).
PyObject* py_commit(PyObject*, PyObject* args) {
  const char* op = nullptr;
  PyObject* launches = nullptr;
  if (!PyArg_ParseTuple(args, "sO!", &op, &PyList_Type, &launches)) return nullptr;
  auto program = std::make_shared<Program>();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(launches); ++i) {
    program->launches.emplace_back();
    if (!parse_launch(PyList_GET_ITEM(launches, i), program->launches.back())) return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (pending.empty() || pending.back().op != op || pending.back().epoch != epoch) Py_RETURN_FALSE;
  program->device = pending.back().device;
  if (num_records >= kMaxRecords) stores.clear(), num_records = 0;
  auto& slot = stores[op][pending.back().key];
  if (!slot) ++num_records;
  slot = std::move(program);
  ++commits;
  Py_RETURN_TRUE;
}

// set_state(allowed, hook_lists, dry_run=False, replay_cpu=False): whether replays may run, the
// launch hook lists to watch, and the tests' switches.
PyObject* py_set_state(PyObject*, PyObject* args) {
  int on = 0, dry = 0, cpu = 0;
  PyObject* lists = nullptr;
  if (!PyArg_ParseTuple(args, "pO!|pp", &on, &PyTuple_Type, &lists, &dry, &cpu)) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists); ++i) {
    if (!PyList_Check(PyTuple_GET_ITEM(lists, i))) {
      PyErr_SetString(PyExc_TypeError, "hook_lists: a tuple of lists");
      return nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  for (PyObject* l : hook_lists) Py_DECREF(l);
  hook_lists.clear();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists); ++i) {
    PyObject* l = PyTuple_GET_ITEM(lists, i);
    Py_INCREF(l);
    hook_lists.push_back(l);
  }
  const c10::DeviceType type = cpu ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
  if (dry_run != (dry != 0) || replay_type != type) stores.clear(), num_records = 0, ++epoch;
  allowed = on != 0;
  dry_run = dry != 0;
  replay_type = type;
  Py_RETURN_NONE;
}

// clear(): forget every record (the launch tables or the platform changed).
PyObject* py_clear(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(mu);
  stores.clear();
  num_records = 0;
  ++epoch;
  Py_RETURN_NONE;
}

// stats() -> {"hits", "misses", "commits", "records", "allowed", "driver"}
PyObject* py_stats(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(mu);
  return Py_BuildValue("{sKsKsKsnsOss}", "hits", static_cast<unsigned long long>(hits), "misses",
                       static_cast<unsigned long long>(misses), "commits",
                       static_cast<unsigned long long>(commits), "records",
                       static_cast<Py_ssize_t>(num_records), "allowed",
                       allowed ? Py_True : Py_False, "replay_device",
                       replay_type == c10::DeviceType::CPU ? "cpu" : "cuda");
}

// take_log() -> [(function, grid, block, shared_bytes, pdl, cooperative, (param bytes, ...))]:
// the dry run's launches since the last call (tests).
PyObject* py_take_log(PyObject*, PyObject*) {
  std::vector<LogEntry> log;
  {
    std::lock_guard<std::mutex> lock(mu);
    log.swap(dry_log);
  }
  PyObject* out = PyList_New(0);
  for (const LogEntry& e : log) {
    PyObject* params = PyTuple_New(static_cast<Py_ssize_t>(e.params.size()));
    for (size_t i = 0; i < e.params.size(); ++i) {
      PyTuple_SET_ITEM(params, i, PyBytes_FromStringAndSize(e.params[i].data(), e.params[i].size()));
    }
    PyObject* item = Py_BuildValue("K(III)IIOON", static_cast<unsigned long long>(e.function),
                                   e.grid[0], e.grid[1], e.grid[2], e.block, e.shared_bytes,
                                   e.pdl ? Py_True : Py_False, e.cooperative ? Py_True : Py_False,
                                   params);
    PyList_Append(out, item);
    Py_DECREF(item);
  }
  return out;
}

// drop_key_field(name): leave one field out of the key ("" restores it) — a mutant the tests
// must kill.
PyObject* py_drop_key_field(PyObject*, PyObject* args) {
  const char* field = nullptr;
  if (!PyArg_ParseTuple(args, "s", &field)) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  dropped_field = field;
  stores.clear();
  num_records = 0;
  ++epoch;
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"commit", py_commit, METH_VARARGS, "store the record of the pending call of an op"},
    {"set_state", py_set_state, METH_VARARGS, "whether replays may run; hook lists; test switches"},
    {"clear", py_clear, METH_NOARGS, "forget every record"},
    {"stats", py_stats, METH_NOARGS, "replay counters"},
    {"take_log", py_take_log, METH_NOARGS, "the dry run's launches (tests)"},
    {"drop_key_field", py_drop_key_field, METH_VARARGS, "a key mutant (tests)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* module_methods() { return methods; }

void register_backend_select(torch::Library& m, const std::vector<std::string>& names) {
  impl_backend_select(m, names);
}

}  // namespace mla_replay
