// The C++ side of the torch.ops.mla library: schemas, Meta (shape) kernels, and the two
// device-independent kernels every mutating op needs (Autograd, ADInplaceOrView).
//
// A process that loads only this library (a C++ runtime, a torch.export program being loaded)
// knows the ops' schemas and output shapes. Device kernels (CPU reference, CUDA/HIP Triton)
// live in Python: `import mla_ops` registers them onto these schemas.
//
// Every check mirrors mla_ops/checks.py: same order, same message, same Python exception type
// (TORCH_CHECK_VALUE -> ValueError, TORCH_CHECK_TYPE -> TypeError). Sizes are read as SymInts
// and compared with SymInt operators, so dynamic shapes trace: a comparison guards exactly
// where the Python check does. Python-only checks (argument types) are done by the schema.
//
// The schemas must stay identical to mla_ops.library.SCHEMAS (tests/test_csrc_meta.py).

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

namespace mla_meta {
namespace {

using at::ScalarType;
using at::Tensor;
using c10::SymInt;
using c10::SymIntArrayRef;
using OptTensor = std::optional<Tensor>;

// --- Python-style formatting ----------------------------------------------------------------

// `str(torch.<dtype>)` without the "torch." prefix.
std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::Bool: return "bool";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return c10::toString(t);
  }
}

// `str(t.dtype)`
std::string dtype_str(ScalarType t) { return "torch." + dtype_name(t); }

// Messages are built with std::string alone. No std::ostream of this library may reach a
// function compiled into libc10 (`operator<<(std::ostream&, const SymInt&)`, or the
// ostringstream that TORCH_CHECK's c10::str instantiates here): with torch wheels built by
// another toolchain that crosses two libstdc++ builds and segfaulted on the H200 image
// (torch 2.11, g++ 13) at the first failed check.
std::string sym_str(const SymInt& v) {
  if (auto i = v.maybe_as_int()) return std::to_string(*i);
  return v.toSymNodeImplUnowned()->str();
}

inline void cat_one(std::string& s, const char* x) { s += x; }
inline void cat_one(std::string& s, const std::string& x) { s += x; }
inline void cat_one(std::string& s, const SymInt& x) { s += sym_str(x); }
inline void cat_one(std::string& s, int64_t x) { s += std::to_string(x); }
inline void cat_one(std::string& s, int x) { s += std::to_string(x); }
inline void cat_one(std::string& s, size_t x) { s += std::to_string(x); }

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  (cat_one(s, args), ...);
  return s;
}

// TORCH_CHECK_VALUE / TORCH_CHECK_TYPE / TORCH_CHECK with a message made by cat(): c10::str of
// a single std::string returns it as is, so no stream is involved.
#define MLA_CHECK_VALUE(cond, ...) \
  if (C10_UNLIKELY(!(cond))) C10_THROW_ERROR(ValueError, ::mla_meta::cat(__VA_ARGS__))
#define MLA_CHECK_TYPE(cond, ...) \
  if (C10_UNLIKELY(!(cond))) C10_THROW_ERROR(TypeError, ::mla_meta::cat(__VA_ARGS__))
#define MLA_CHECK(cond, ...) \
  if (C10_UNLIKELY(!(cond))) C10_THROW_ERROR(Error, ::mla_meta::cat(__VA_ARGS__))

// `str(tuple(xs))`: "(4, 16, 576)", "(4,)", "()".
template <typename Ints>
std::string tuple_str(const Ints& xs) {
  std::string s = "(";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ", ";
    cat_one(s, xs[i]);
  }
  if (xs.size() == 1) s += ",";
  s += ")";
  return s;
}

std::string shape_str(const Tensor& t) { return tuple_str(t.sym_sizes()); }
std::string strides_str(const Tensor& t) { return tuple_str(t.sym_strides()); }

SymInt last(const Tensor& t, int64_t from_end = 1) { return t.sym_size(t.dim() - from_end); }

bool is_pow2(const SymInt& n) {
  // Head dims pick kernel variants, so they are specialized here, as Python's `&` does.
  const int64_t v = n.guard_int(__FILE__, __LINE__);
  return v > 0 && (v & (v - 1)) == 0;
}

// --- the shared checks of mla_ops/checks.py -------------------------------------------------

const std::initializer_list<ScalarType> kAct = {
    ScalarType::Half, ScalarType::BFloat16, ScalarType::Float};
const std::initializer_list<ScalarType> kActFp8 = {
    ScalarType::Half,          ScalarType::BFloat16,        ScalarType::Float,
    ScalarType::Float8_e4m3fn, ScalarType::Float8_e4m3fnuz, ScalarType::Float8_e5m2,
    ScalarType::Float8_e5m2fnuz};
const std::initializer_list<ScalarType> kFp8 = {
    ScalarType::Float8_e4m3fn, ScalarType::Float8_e4m3fnuz, ScalarType::Float8_e5m2,
    ScalarType::Float8_e5m2fnuz};

bool contains(std::initializer_list<ScalarType> set, ScalarType t) {
  for (auto s : set) {
    if (s == t) return true;
  }
  return false;
}

// _tensor(name, t, rank=..., dtypes=...); an empty `ranks` / `dtypes` skips that check.
void check_tensor(const char* name, const Tensor& t, std::initializer_list<int64_t> ranks,
                  std::initializer_list<ScalarType> dtypes) {
  if (ranks.size()) {
    bool ok = false;
    std::string want;
    for (auto r : ranks) {
      ok = ok || t.dim() == r;
      want += (want.empty() ? "" : " or ") + std::to_string(r) + "-D";
    }
    MLA_CHECK_VALUE(ok, name, ": expected a ", want, " tensor, got shape ", shape_str(t));
  }
  if (dtypes.size() && !contains(dtypes, t.scalar_type())) {
    std::string names;
    for (auto d : dtypes) names += (names.empty() ? "" : ", ") + dtype_name(d);
    MLA_CHECK_TYPE(false, name, ": expected dtype in (", names, "), got ",
                     dtype_str(t.scalar_type()));
  }
}

// _shape(name, t, expected)
void check_shape(const char* name, const Tensor& t, std::initializer_list<SymInt> expected) {
  auto got = t.sym_sizes();
  bool ok = got.size() == expected.size();
  size_t i = 0;
  for (auto it = expected.begin(); ok && it != expected.end(); ++it, ++i) ok = got[i] == *it;
  MLA_CHECK_VALUE(ok, name, ": expected shape ", tuple_str(std::vector<SymInt>(expected)),
                    ", got ", shape_str(t));
}

// _inner_contiguous(name, t)
void check_inner_contiguous(const char* name, const Tensor& t) {
  MLA_CHECK_VALUE(!(last(t) > 1 && t.sym_stride(t.dim() - 1) != 1), name,
                    ": the last dimension must be contiguous (stride 1), got strides ",
                    strides_str(t));
}

// _int(name, v, minimum=...): the schema already made v an int.
void check_int(const char* name, int64_t v, int64_t minimum) {
  MLA_CHECK_VALUE(v >= minimum, name, ": expected an int >= ", minimum, ", got ", v);
}

// _same_device(device, **tensors)
void check_device(const c10::Device& device,
                  std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    if (t == nullptr || !t->defined()) continue;
    MLA_CHECK_VALUE(t->device() == device, name, ": expected a tensor on ", device.str(),
                      " (the device of q), got ", t->device().str());
  }
}

const Tensor* ptr(const OptTensor& t) { return t.has_value() ? &*t : nullptr; }

// _cache_layout(k_buffer, page_size)
void check_cache_layout(const Tensor& k_buffer, int64_t page_size) {
  check_tensor("k_buffer", k_buffer, {3, 4}, kActFp8);
  MLA_CHECK_VALUE(last(k_buffer, 2) == 1,
                    "k_buffer: expected one latent KV head (shape[-2] == 1), got shape ",
                    shape_str(k_buffer));
  check_int("page_size", page_size, 1);
  if (k_buffer.dim() == 4) {
    MLA_CHECK_VALUE(k_buffer.sym_size(1) == page_size, "page_size: ", page_size,
                      " does not match k_buffer's pages of ", k_buffer.sym_size(1),
                      " tokens (shape ", shape_str(k_buffer), ")");
  }
  if (k_buffer.dim() == 3) {
    const SymInt tokens = k_buffer.sym_size(0);
    MLA_CHECK_VALUE(tokens % page_size == 0, "page_size: a 3-D k_buffer of ", tokens,
                      " tokens is not a whole number of pages of ", page_size);
    MLA_CHECK_VALUE(
        !(page_size > 1 && tokens > page_size && k_buffer.sym_stride(0) == 0),
        "k_buffer: token stride 0 is not a valid cache layout");
  }
  check_inner_contiguous("k_buffer", k_buffer);
}

void check_cache_dtype(const Tensor& q, const Tensor& k_buffer) {
  MLA_CHECK_TYPE(
      contains(kFp8, k_buffer.scalar_type()) || k_buffer.scalar_type() == q.scalar_type(),
      "k_buffer: expected the dtype of q (", dtype_str(q.scalar_type()),
      ") or an fp8 dtype, got ", dtype_str(k_buffer.scalar_type()));
}

void check_k_scale(const OptTensor& k_scale) {
  if (!k_scale.has_value()) return;
  check_tensor("k_scale", *k_scale, {}, {ScalarType::Float});
  MLA_CHECK_VALUE(k_scale->sym_numel() == 1, "k_scale: expected a scalar tensor, got shape ",
                    shape_str(*k_scale));
}

// --- Meta kernels ---------------------------------------------------------------------------

// check_decode_verify
void decode_verify_meta(const Tensor& q, const Tensor& k_buffer, const Tensor& v_buffer,
                        const Tensor& o, const Tensor& lse, const Tensor& req_to_token,
                        const Tensor& seq_lens, const OptTensor& real_seq_lens, int64_t qlen,
                        const OptTensor& attn_logits, int64_t num_kv_splits, double sm_scale,
                        int64_t page_size, const OptTensor& k_scale) {
  (void)sm_scale;  // typed by the schema
  check_tensor("q", q, {3}, kAct);
  const c10::Device dev = q.device();
  check_cache_layout(k_buffer, page_size);
  check_cache_dtype(q, k_buffer);

  // _latent_dims(k_buffer, v_buffer)
  check_tensor("v_buffer", v_buffer, {k_buffer.dim()}, {});
  MLA_CHECK_TYPE(v_buffer.scalar_type() == k_buffer.scalar_type(),
                   "v_buffer: expected the dtype of k_buffer (",
                   dtype_str(k_buffer.scalar_type()), "), got ",
                   dtype_str(v_buffer.scalar_type()));
  const auto k_sizes = k_buffer.sym_sizes();
  const auto v_sizes = v_buffer.sym_sizes();
  const auto k_lead = k_sizes.slice(0, k_sizes.size() - 1);
  MLA_CHECK_VALUE(v_sizes.slice(0, v_sizes.size() - 1).equals(k_lead),
                    "v_buffer: expected k_buffer[..., :Lv] with leading shape ",
                    tuple_str(k_lead), ", got shape ", shape_str(v_buffer));
  // V is read from K, so v_buffer's strides are not checked (as in checks.py).
  const SymInt Lk = last(k_buffer);
  const SymInt Lv = last(v_buffer);
  const SymInt rope = Lk - Lv;
  MLA_CHECK_VALUE(!(!is_pow2(Lv) || rope < 0 || (rope > 0 && !is_pow2(rope))),
                    "v_buffer: expected Lk = Lv + rope with Lv and rope powers of two "
                    "(576 = 512 + 64), got Lk=",
                    Lk, ", Lv=", Lv);

  const SymInt rows = q.sym_size(0);
  const SymInt heads = q.sym_size(1);
  MLA_CHECK_VALUE(q.sym_size(2) == Lk, "q: expected head dim Lk=", Lk,
                    " (k_buffer.shape[-1]), got shape ", shape_str(q));
  check_inner_contiguous("q", q);
  check_int("qlen", qlen, 1);
  MLA_CHECK_VALUE(rows % qlen == 0, "qlen: q has ", rows, " rows, not a multiple of qlen=",
                    qlen, " (rows are [B*qlen, ...])");
  const SymInt batch = rows / qlen;

  check_tensor("o", o, {3}, {q.scalar_type()});
  check_shape("o", o, {rows, heads, Lv});
  check_inner_contiguous("o", o);
  check_tensor("lse", lse, {2}, {ScalarType::Float});
  check_shape("lse", lse, {rows, heads});
  check_tensor("req_to_token", req_to_token, {2}, {ScalarType::Int});
  MLA_CHECK_VALUE(!(req_to_token.sym_size(0) < batch),
                    "req_to_token: expected one row per request (", batch, "), got shape ",
                    shape_str(req_to_token));
  check_tensor("seq_lens", seq_lens, {1}, {ScalarType::Int});
  check_shape("seq_lens", seq_lens, {batch});
  if (real_seq_lens.has_value()) {
    check_tensor("real_seq_lens", *real_seq_lens, {1}, {ScalarType::Int});
    check_shape("real_seq_lens", *real_seq_lens, {batch});
  }
  check_int("num_kv_splits", num_kv_splits, 1);
  if (num_kv_splits > 1 || attn_logits.has_value()) {
    MLA_CHECK_VALUE(attn_logits.has_value(),
                      "attn_logits: a workspace is required when num_kv_splits=", num_kv_splits,
                      " > 1");
    check_tensor("attn_logits", *attn_logits, {4}, {ScalarType::Float});
    if (num_kv_splits > 1) {
      const auto got = attn_logits->sym_sizes();
      const bool small = got[0] < rows || got[1] != heads || got[2] != num_kv_splits ||
                         got[3] < Lv + 1;
      MLA_CHECK_VALUE(!small, "attn_logits: workspace too small for num_kv_splits=",
                        num_kv_splits,
                        ": expected [B*qlen, H, num_kv_splits, Lv+1] = ",
                        tuple_str(std::vector<SymInt>{rows, heads, num_kv_splits, Lv + 1}),
                        " (at least), got ", tuple_str(got));
      check_inner_contiguous("attn_logits", *attn_logits);
    }
  }
  check_k_scale(k_scale);
  check_device(dev, {{"k_buffer", &k_buffer},
                     {"v_buffer", &v_buffer},
                     {"o", &o},
                     {"lse", &lse},
                     {"req_to_token", &req_to_token},
                     {"seq_lens", &seq_lens},
                     {"real_seq_lens", ptr(real_seq_lens)},
                     {"attn_logits", ptr(attn_logits)},
                     {"k_scale", ptr(k_scale)}});
}

// check_warmup_decode_verify
void warmup_decode_verify_meta(const Tensor& q, const Tensor& k_buffer, const Tensor& o,
                               const Tensor& lse, const Tensor& req_to_token, bool has_real,
                               at::IntArrayRef qlens, const OptTensor& attn_logits,
                               double sm_scale, int64_t page_size, const OptTensor& k_scale) {
  (void)has_real;
  (void)sm_scale;
  check_tensor("q", q, {3}, kAct);
  check_cache_layout(k_buffer, page_size);
  check_cache_dtype(q, k_buffer);
  const SymInt Lk = last(k_buffer);
  MLA_CHECK_VALUE(q.sym_size(2) == Lk, "q: expected head dim Lk=", Lk,
                    " (k_buffer.shape[-1]), got shape ", shape_str(q));
  check_tensor("o", o, {3}, {q.scalar_type()});
  const SymInt Lv = last(o);
  const SymInt rope = Lk - Lv;
  MLA_CHECK_VALUE(!(!is_pow2(Lv) || rope < 0 || (rope > 0 && !is_pow2(rope))),
                    "o: expected Lv with Lk = Lv + rope, both powers of two, got Lk=", Lk,
                    ", Lv=", Lv);
  MLA_CHECK_VALUE(o.sym_size(1) == q.sym_size(1), "o: expected ", q.sym_size(1),
                    " heads (q.shape[1]), got shape ", shape_str(o));
  check_tensor("lse", lse, {2}, {ScalarType::Float});
  MLA_CHECK_VALUE(lse.sym_size(1) == q.sym_size(1), "lse: expected ", q.sym_size(1),
                    " heads (q.shape[1]), got shape ", shape_str(lse));
  check_tensor("req_to_token", req_to_token, {2}, {ScalarType::Int});
  MLA_CHECK_VALUE(!qlens.empty(), "qlens: expected a non-empty list of ints, got []");
  for (int64_t t : qlens) check_int("qlens", t, 1);
  if (attn_logits.has_value()) {
    check_tensor("attn_logits", *attn_logits, {}, {ScalarType::Float});
  }
  check_k_scale(k_scale);
  check_device(q.device(), {{"k_buffer", &k_buffer},
                            {"o", &o},
                            {"lse", &lse},
                            {"req_to_token", &req_to_token},
                            {"attn_logits", ptr(attn_logits)},
                            {"k_scale", ptr(k_scale)}});
}

// check_context_attention
void context_attention_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                            const Tensor& b_start_loc, const Tensor& b_seq_len,
                            int64_t max_input_len, bool is_causal,
                            std::optional<double> softmax_scale,
                            std::optional<int64_t> sliding_window_q,
                            std::optional<int64_t> sliding_window_k, const OptTensor& sinks) {
  (void)is_causal;
  (void)softmax_scale;
  check_tensor("q", q, {3}, kAct);
  check_tensor("k", k, {3}, {q.scalar_type()});
  check_tensor("v", v, {3}, {q.scalar_type()});
  check_tensor("o", o, {3}, {q.scalar_type()});
  const SymInt total = q.sym_size(0), hq = q.sym_size(1), d = q.sym_size(2);
  MLA_CHECK_VALUE(k.sym_size(2) == d, "k: expected head dim ", d,
                    " (q.shape[2]), got shape ", shape_str(k));
  MLA_CHECK_VALUE(v.sym_sizes().equals(k.sym_sizes()), "v: expected the shape of k ",
                    shape_str(k), ", got ", shape_str(v));
  MLA_CHECK_VALUE(k.sym_size(0) == total, "k: expected ", total,
                    " tokens (q.shape[0]), got shape ", shape_str(k));
  const SymInt hkv = k.sym_size(1);
  MLA_CHECK_VALUE(!(hkv == 0 || hq % hkv != 0), "k: query heads (", hq,
                    ") must be a multiple of KV heads (", hkv, ")");
  check_shape("o", o, {total, hq, d});
  check_inner_contiguous("q", q);
  check_inner_contiguous("k", k);
  check_inner_contiguous("v", v);
  check_inner_contiguous("o", o);
  check_tensor("b_start_loc", b_start_loc, {1}, {ScalarType::Int, ScalarType::Long});
  check_tensor("b_seq_len", b_seq_len, {1}, {ScalarType::Int, ScalarType::Long});
  MLA_CHECK_VALUE(b_start_loc.sym_size(0) == b_seq_len.sym_size(0),
                    "b_seq_len: expected one length per start in b_start_loc (",
                    b_start_loc.sym_size(0), "), got ", b_seq_len.sym_size(0));
  check_int("max_input_len", max_input_len, 0);
  if (sliding_window_q.has_value()) check_int("sliding_window_q", *sliding_window_q, 0);
  if (sliding_window_k.has_value()) check_int("sliding_window_k", *sliding_window_k, 0);
  if (sinks.has_value()) {
    check_tensor("sinks", *sinks, {1}, kAct);
    check_shape("sinks", *sinks, {hq});
  }
  check_device(q.device(), {{"k", &k},
                            {"v", &v},
                            {"o", &o},
                            {"b_start_loc", &b_start_loc},
                            {"b_seq_len", &b_seq_len},
                            {"sinks", ptr(sinks)}});
}

// --- Autograd and ADInplaceOrView: shared by the three ops ----------------------------------

// No autograd formula exists (SPEC: inference-only). Without this kernel torch's fallback would
// run the op and leave its outputs silently detached; refuse instead, naming the argument.
void inference_only(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                    torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  if (c10::GradMode::is_enabled()) {
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = (*stack)[stack->size() - n + i];
      MLA_CHECK(!(v.isTensor() && v.toTensor().requires_grad()), op.schema().name(),
                  " is inference-only (no autograd formula is registered), but ",
                  args[i].name(),
                  " requires grad: call it under torch.no_grad() or torch.inference_mode(), "
                  "or pass tensors that do not require grad");
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

}  // namespace
}  // namespace mla_meta

namespace mla_meta {
namespace {

constexpr const char* kOps[] = {"decode_verify", "warmup_decode_verify", "context_attention"};
constexpr const char* kMutatingOps[] = {"decode_verify", "context_attention"};

// Keep identical to mla_ops.library.SCHEMAS; custom_op tags its ops pt2_compliant_tag, so do we.
void define_schemas(torch::Library& m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def(
      "decode_verify(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, "
      "Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, "
      "Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, "
      "Tensor? k_scale=None) -> ()",
      tags);
  m.def(
      "warmup_decode_verify(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, "
      "Tensor req_to_token, bool has_real, int[] qlens, Tensor? attn_logits, float sm_scale, "
      "int page_size, Tensor? k_scale=None) -> ()",
      tags);
  m.def(
      "context_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, "
      "Tensor b_seq_len, int max_input_len, bool is_causal=True, float? softmax_scale=None, "
      "int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()",
      tags);
}

void impl_meta(torch::Library& m) {
  m.impl("decode_verify", &decode_verify_meta);
  m.impl("warmup_decode_verify", &warmup_decode_verify_meta);
  m.impl("context_attention", &context_attention_meta);
}

void impl_autograd(torch::Library& m) {
  for (const char* name : kOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&inference_only>());
  }
}

// Only the ops that write an argument, as custom_op registers it.
void impl_ad_inplace_or_view(torch::Library& m) {
  for (const char* name : kMutatingOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&bump_mutated_versions>());
  }
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
    for (const char* name : kOps) {
      if (c10::Dispatcher::singleton().findSchema({std::string("mla::") + name, ""})) {
        TORCH_WARN(::mla_meta::cat("mla_ops/_C: mla::", name,
                   " is already defined in this process (mla_ops imported in pure-Python "
                   "mode, or another copy of this library loaded); not registering again"));
        return;
      }
    }
    add(torch::Library::DEF, std::nullopt, &define_schemas);
    add(torch::Library::IMPL, c10::DispatchKey::Meta, &impl_meta);
    add(torch::Library::IMPL, c10::DispatchKey::Autograd, &impl_autograd);
    add(torch::Library::IMPL, c10::DispatchKey::ADInplaceOrView, &impl_ad_inplace_or_view);
  }
};

const Registrations registrations;

}  // namespace
}  // namespace mla_meta

// `import mla_ops._C` works too (an empty module); loading the file runs the registrations.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
