// The C++ side of the torch.ops.mla library: schemas, Meta kernels, the two
// device-independent kernels every mutating op needs (Autograd, ADInplaceOrView), and the
// BackendSelect kernel that replays recorded launches (mla_replay.cpp).
//
// A process that loads only this library (a C++ runtime, a torch.export program being loaded)
// knows the ops' schemas and checks their arguments with the same errors as the Python package.
// The schemas and the Meta kernels are generated from mla_ops/spec.py at build time
// (mla_spec_generated.inc, written by setup.py); this file holds what they need: message
// formatting in Python's words, and the registration. Device kernels (CPU reference,
// CUDA/HIP Triton) live in Python: `import mla_ops` registers them onto these schemas.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mla_replay {
PyMethodDef* module_methods();
void register_backend_select(torch::Library& m, const std::vector<std::string>& names);
}  // namespace mla_replay

namespace mla_meta {
namespace {

using c10::SymInt;

// --- Python's words -------------------------------------------------------------------------
// Messages are built with std::string alone. No std::ostream of this library may reach a
// function compiled into libc10 (`operator<<(std::ostream&, const SymInt&)`, or the
// ostringstream that TORCH_CHECK's c10::str instantiates here): with torch wheels built by
// another toolchain that crosses two libstdc++ builds and segfaulted on the H200 image
// (torch 2.11, g++ 13) at the first failed check.

// `str(torch.<dtype>)` without the "torch." prefix: c10's name in lower case ("bfloat16",
// "float8_e4m3fn", "uint16", "qint8", ...) except for the eleven that torch renames.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::ScalarType::Half: return "float16";
    case at::ScalarType::Float: return "float32";
    case at::ScalarType::Double: return "float64";
    case at::ScalarType::ComplexHalf: return "complex32";
    case at::ScalarType::ComplexFloat: return "complex64";
    case at::ScalarType::ComplexDouble: return "complex128";
    case at::ScalarType::Byte: return "uint8";
    case at::ScalarType::Char: return "int8";
    case at::ScalarType::Short: return "int16";
    case at::ScalarType::Int: return "int32";
    case at::ScalarType::Long: return "int64";
    default: {
      std::string s = c10::toString(t);
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    }
  }
}

std::string dtype_str(at::ScalarType t) { return "torch." + dtype_name(t); }

std::string sym_str(const SymInt& v) {
  if (auto i = v.maybe_as_int()) return std::to_string(*i);
  return v.toSymNodeImplUnowned()->str();
}

// repr(float): the shortest round-trip digits, "1.0" not "1", "nan", "inf".
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

template <typename Ints>
std::string tuple_str(const Ints& xs);

inline void cat_one(std::string& s, const char* x) { s += x; }
inline void cat_one(std::string& s, const std::string& x) { s += x; }
inline void cat_one(std::string& s, const SymInt& x) { s += sym_str(x); }
inline void cat_one(std::string& s, int64_t x) { s += std::to_string(x); }
inline void cat_one(std::string& s, double x) { s += py_float(x); }
inline void cat_one(std::string& s, const c10::Device& d) { s += d.str(); }
inline void cat_one(std::string& s, const std::vector<SymInt>& xs) { s += tuple_str(xs); }
inline void cat_one(std::string& s, at::IntArrayRef xs) {  // str(list)
  s += "[";
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + std::to_string(xs[i]);
  s += "]";
}

// `str(tuple(xs))`: "(4, 16, 576)", "(4,)", "()".
template <typename Ints>
std::string tuple_str(const Ints& xs) {
  std::string s = "(";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ", ";
    cat_one(s, xs[i]);
  }
  if (xs.size() == 1) s += ",";
  return s + ")";
}

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  (cat_one(s, args), ...);
  return s;
}

// TORCH_CHECK_VALUE / TORCH_CHECK_TYPE with a message made by cat(): ValueError / TypeError in
// Python, no stream involved.
#define MLA_CHECK_VALUE(cond, ...) \
  if (C10_UNLIKELY(!(cond))) C10_THROW_ERROR(ValueError, ::mla_meta::cat(__VA_ARGS__))
#define MLA_CHECK_TYPE(cond, ...) \
  if (C10_UNLIKELY(!(cond))) C10_THROW_ERROR(TypeError, ::mla_meta::cat(__VA_ARGS__))

// --- the helpers the spec's expressions call (mla_ops.spec._CPP_CALLS) ---------------------

// Shapes and strides as tuples: compared, or printed by cat() as Python prints a tuple.
std::vector<SymInt> sizes_of(const at::Tensor& t) { return t.sym_sizes().vec(); }
std::vector<SymInt> strides_of(const at::Tensor& t) { return t.sym_strides().vec(); }
std::vector<SymInt> lead_sizes(const at::Tensor& t) {
  auto s = t.sym_sizes();
  return {s.begin(), s.end() - 1};
}
int64_t list_len(at::IntArrayRef xs) { return static_cast<int64_t>(xs.size()); }

bool is_pow2(const SymInt& n) {
  // Head dims pick kernel variants, so they are specialized here, as Python's `&` does.
  const int64_t v = n.guard_int(__FILE__, __LINE__);
  return v > 0 && (v & (v - 1)) == 0;
}

bool contains(std::initializer_list<at::ScalarType> set, at::ScalarType t) {
  for (auto s : set) {
    if (s == t) return true;
  }
  return false;
}

struct OpDef {
  const char* name;
  const char* schema;
  bool mutates;
};

#include "mla_spec_generated.inc"

// --- Autograd and ADInplaceOrView: shared by every op ---------------------------------------

// No autograd formula exists (inference-only). Without this kernel torch's fallback would run
// the op and leave its outputs silently detached; refuse instead, naming the argument.
void inference_only(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                    torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  if (c10::GradMode::is_enabled()) {
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = (*stack)[stack->size() - n + i];
      if (v.isTensor() && v.toTensor().requires_grad()) {
        C10_THROW_ERROR(Error, cat(op.schema().name(),
                                   " is inference-only (no autograd formula is registered), but ",
                                   args[i].name(),
                                   " requires grad: call it under torch.no_grad() or "
                                   "torch.inference_mode(), or pass tensors that do not require "
                                   "grad"));
      }
    }
  }
  c10::impl::ExcludeDispatchKeyGuard guard(c10::autograd_dispatch_keyset);
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

// Bump the version counter of every argument the schema marks as written (what custom_op
// does), so autograd notices a tensor saved for backward elsewhere being overwritten here.
void bump_mutated_versions(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                           torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  for (size_t i = 0; i < n; ++i) {
    const auto* alias = args[i].alias_info();
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    // Inference tensors have no version counter (torch.autograd.graph.increment_version
    // skips them too).
    if (alias != nullptr && alias->isWrite() && v.isTensor() && !v.toTensor().is_inference()) {
      v.toTensor().unsafeGetTensorImpl()->bump_version();
    }
  }
  op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
}

// custom_op tags its ops pt2_compliant_tag, so do we.
void define_schemas(torch::Library& m) {
  for (const auto& op : kOpDefs) m.def(op.schema, {at::Tag::pt2_compliant_tag});
}

void impl_autograd(torch::Library& m) {
  for (const auto& op : kOpDefs) {
    m.impl(op.name, torch::CppFunction::makeFromBoxedFunction<&inference_only>());
  }
}

// Only the ops that write an argument, as custom_op registers it.
void impl_ad_inplace_or_view(torch::Library& m) {
  for (const auto& op : kOpDefs) {
    if (op.mutates) {
      m.impl(op.name, torch::CppFunction::makeFromBoxedFunction<&bump_mutated_versions>());
    }
  }
}

void impl_backend_select(torch::Library& m) {
  std::vector<std::string> names;
  for (const auto& op : kOpDefs) names.emplace_back(op.name);
  mla_replay::register_backend_select(m, names);
}

// What TORCH_LIBRARY(mla, m) and TORCH_LIBRARY_IMPL(mla, <key>, m) would do, except that a
// second definition (pure-Python mla_ops imported first, or another copy of this file loaded)
// is skipped with a warning: the TORCH_LIBRARY macros would throw from a static initializer,
// which aborts the process inside dlopen.
struct Registrations {
  std::vector<std::unique_ptr<torch::Library>> libs;

  void add(torch::Library::Kind kind, std::optional<c10::DispatchKey> key,
           void (*fn)(torch::Library&)) {
    libs.push_back(std::make_unique<torch::Library>(kind, "mla", key, __FILE__, __LINE__));
    fn(*libs.back());
  }

  Registrations() {
    for (const auto& op : kOpDefs) {
      if (c10::Dispatcher::singleton().findSchema({std::string("mla::") + op.name, ""})) {
        TORCH_WARN(cat("mla_ops/_C: mla::", op.name,
                       " is already defined in this process (mla_ops imported in pure-Python "
                       "mode, or another copy of this library loaded); not registering again"));
        return;
      }
    }
    add(torch::Library::DEF, std::nullopt, &define_schemas);
    add(torch::Library::IMPL, c10::DispatchKey::Meta, &impl_meta);
    add(torch::Library::IMPL, c10::DispatchKey::Autograd, &impl_autograd);
    add(torch::Library::IMPL, c10::DispatchKey::ADInplaceOrView, &impl_ad_inplace_or_view);
    add(torch::Library::IMPL, c10::DispatchKey::BackendSelect, &impl_backend_select);
  }
};

const Registrations registrations;

}  // namespace
}  // namespace mla_meta

// `import mla_ops._C`: the replay's switches and records (mla_replay.cpp); loading the file
// (torch.ops.load_library) runs the registrations.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1,
                                      mla_replay::module_methods()};
  return PyModule_Create(&module);
}
