// Core types: the error class, dtypes, devices, Tensor (properties, views, conversions, numpy),
// factories, memory statistics and generators.
#include <memory>

#include <pybind11/operators.h>

#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

Shape shape_from_args(const py::args& args) {
  if (args.size() == 1 && !py::isinstance<py::int_>(args[0]) &&
      py::isinstance<py::sequence>(args[0])) {
    return args[0].cast<Shape>();
  }
  return args.cast<Shape>();
}

Shape dims_from_object(const py::object& dims) {
  if (dims.is_none()) return {};
  if (py::isinstance<py::int_>(dims)) return {dims.cast<int64_t>()};
  return dims.cast<Shape>();
}

PyCallable::PyCallable(py::function f)
    : fn_(new py::function(std::move(f)), [](py::function* p) {
        // Note [Python callables in the graph]: the last owner may be a node destroyed in
        // backward with the GIL released, or during interpreter shutdown.
        if (!Py_IsInitialized()) return;  // leak rather than touch a finalized interpreter
        py::gil_scoped_acquire gil;
        delete p;
      }) {}

py::object PyCallable::operator()(const py::tuple& args) const {
  py::gil_scoped_acquire gil;
  return (*fn_)(*args);
}

namespace {

// ---- numpy ----

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::Float32:
      return py::dtype::of<float>();
    case DType::Float16:
      return py::dtype("float16");
    case DType::Int32:
      return py::dtype::of<int32_t>();
    case DType::Int64:
      return py::dtype::of<int64_t>();
    case DType::Bool:
      return py::dtype::of<bool>();
    case DType::BFloat16:
      TD_ERROR("numpy(): numpy has no bfloat16 dtype; convert first with .float()");
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:  // as torch: .numpy() refuses float8, .tolist() converts
      TD_ERROR("numpy(): numpy has no ", dtype_name(t), " dtype; convert first with .float()");
  }
  TD_ERROR("numpy(): invalid dtype");
}

DType dtype_from_numpy(const py::dtype& d) {
  char kind = d.kind();
  auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::Float32;
  if (kind == 'f' && size == 2) return DType::Float16;
  if (kind == 'i' && size == 4) return DType::Int32;
  if (kind == 'i' && size == 8) return DType::Int64;
  if (kind == 'b' && size == 1) return DType::Bool;
  TD_ERROR("from_numpy: unsupported numpy dtype ", d.attr("name").cast<std::string>(),
           "; supported: float32, float16, int32, int64, bool (convert with arr.astype(...))");
}

// An array over the tensor's memory (any strides); the capsule base keeps the storage alive.
py::array to_numpy(const Tensor& t) {
  TD_CHECK(t.is_cpu(), "numpy(): tensor is on ", t.device().str(), "; call .cpu() first");
  py::dtype dt = numpy_dtype(t.dtype());
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(s * static_cast<int64_t>(t.element_size()));
  auto owner = std::make_unique<Tensor>(t.detach());
  void* data = t.storage().data() == nullptr ? nullptr : t.data_ptr();
  py::capsule base(owner.get(), [](void* p) { delete static_cast<Tensor*>(p); });
  owner.release();  // now owned by the capsule
  return py::array(dt, shape, strides, data, base);
}

// A tensor over the array's memory; the storage holds a reference to the array.
Tensor from_numpy(const py::array& arr) {
  DType dt = dtype_from_numpy(arr.dtype());
  char order = arr.dtype().byteorder();
  TD_CHECK(order == '=' || order == '|' || order == '<',
           "from_numpy: non-native byte order; use arr.astype(arr.dtype.newbyteorder('='))");
  auto item = static_cast<int64_t>(itemsize(dt));
  Shape sizes, strides;
  int64_t extent = 1;  // elements spanned, from the first one
  bool empty = false;
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    int64_t n = arr.shape(d), s = arr.strides(d);
    TD_CHECK(s >= 0, "from_numpy: negative strides are not supported; pass arr.copy()");
    TD_CHECK(s % item == 0, "from_numpy: byte stride ", s, " is not a multiple of the itemsize ",
             item, "; pass arr.copy()");
    sizes.push_back(n);
    strides.push_back(s / item);
    if (n == 0) empty = true;
    extent += (n - 1) * (s / item);
  }
  if (empty) extent = 0;
  PyObject* ref = arr.ptr();
  Py_INCREF(ref);
  Storage st = Storage::wrap(const_cast<void*>(arr.data()), static_cast<size_t>(extent * item),
                             kCPU, [ref](void*) {
                               if (!Py_IsInitialized()) return;
                               py::gil_scoped_acquire gil;
                               Py_DECREF(ref);
                             });
  return Tensor::make(std::move(st), sizes, strides, 0, dt);
}

py::object item(const Tensor& t) {
  if (t.dtype() == DType::Bool) return py::bool_(t.item<bool>());
  if (is_integral(t.dtype())) return py::int_(t.item<int64_t>());
  return py::float_(t.item_double());
}

TensorOptions options(DType dtype, const Device& device, bool requires_grad) {
  return TensorOptions{dtype, device, requires_grad};
}

py::dict stats_dict(const MemoryStats& s) {
  return py::dict("current_bytes"_a = s.current_bytes, "peak_bytes"_a = s.peak_bytes,
                  "num_allocs"_a = s.num_allocs, "num_frees"_a = s.num_frees,
                  "reserved_bytes"_a = s.reserved_bytes);
}

void bind_dtype_device(py::module_& m) {
  py::enum_<DType> dt(m, "dtype");
  dt.value("float32", DType::Float32)
      .value("bfloat16", DType::BFloat16)
      .value("float16", DType::Float16)
      .value("int32", DType::Int32)
      .value("int64", DType::Int64)
      .value("bool", DType::Bool)
      .value("float8_e4m3fn", DType::Float8E4M3FN)
      .value("float8_e5m2", DType::Float8E5M2)
      .def_property_readonly("is_floating_point", [](DType t) { return is_floating(t); })
      .def_property_readonly("itemsize", [](DType t) { return itemsize(t); });
  dt.attr("__repr__") = py::cpp_function(
      [](DType t) { return std::string("tardelli.") + dtype_name(t); }, py::is_method(dt));
  dt.attr("__str__") = dt.attr("__repr__");
  m.def("promote_types", &promote_types);

  py::class_<Device>(m, "device")
      .def(py::init(&Device::parse), "device"_a)
      .def(py::init([](const std::string& type, int index) {
             return Device::parse(type + ":" + std::to_string(index));
           }),
           "type"_a, "index"_a)
      .def_property_readonly("type", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_property_readonly("index", [](const Device& d) { return d.index; })
      .def("__str__", &Device::str)
      .def("__repr__",
           [](const Device& d) {
             return d.is_cpu() ? std::string("device(type='cpu')")
                               : "device(type='cuda', index=" + std::to_string(d.index) + ")";
           })
      .def(py::self == py::self)
      .def("__eq__", [](const Device& d, const std::string& s) { return d == Device::parse(s); })
      .def("__hash__", [](const Device& d) { return static_cast<int>(d.type) * 1024 + d.index; });
  py::implicitly_convertible<std::string, Device>();
}

void bind_generator(py::module_& m) {
  py::class_<PhiloxState>(m, "PhiloxState")
      .def(py::init([](uint64_t seed, uint64_t offset, uint64_t subsequence) {
             return PhiloxState{seed, offset, subsequence};
           }),
           "seed"_a, "offset"_a = 0, "subsequence"_a = 0)
      .def_readwrite("seed", &PhiloxState::seed)
      .def_readwrite("offset", &PhiloxState::offset)
      .def_readwrite("subsequence", &PhiloxState::subsequence);
  py::class_<Generator>(m, "Generator")
      .def(py::init<uint64_t, uint64_t>(), "seed"_a = 67280421310721ULL, "subsequence"_a = 0)
      .def(
          "manual_seed",
          [](py::object self, uint64_t seed) {
            self.cast<Generator&>().manual_seed(seed);
            return self;
          },
          "seed"_a)
      .def("initial_seed", &Generator::seed)
      .def_property_readonly("offset", &Generator::offset)
      .def_property_readonly("subsequence", &Generator::subsequence)
      .def("get_state",
           [](const Generator& g) { return py::make_tuple(g.seed(), g.offset(), g.subsequence()); })
      .def(
          "set_state",
          [](Generator& g, const std::tuple<uint64_t, uint64_t, uint64_t>& s) {
            g.set_state(std::get<0>(s), std::get<1>(s), std::get<2>(s));
          },
          "state"_a)
      // Generator holds a mutex, so it is neither copyable nor movable: the split is built in
      // place from the returned prvalue and handed to Python as a new owned object.
      .def(
          "split",
          [](const Generator& g, uint64_t index) {
            return std::unique_ptr<Generator>(new Generator(g.split(index)));
          },
          "index"_a)
      .def("reserve", &Generator::reserve, "n"_a);
  m.def("default_generator", &default_generator, py::return_value_policy::reference);
  m.def(
      "manual_seed",
      [](uint64_t seed) -> Generator& {
        manual_seed(seed);
        return default_generator();
      },
      "seed"_a, py::return_value_policy::reference);
}

void bind_factories(py::module_& m) {
  m.def(
      "empty",
      [](const Shape& s, DType dt, const Device& d, bool rg) {
        return empty(s, options(dt, d, rg));
      },
      "size"_a, "dtype"_a, "device"_a, "requires_grad"_a, nogil());
  m.def(
      "zeros",
      [](const Shape& s, DType dt, const Device& d, bool rg) {
        return zeros(s, options(dt, d, rg));
      },
      "size"_a, "dtype"_a, "device"_a, "requires_grad"_a, nogil());
  m.def(
      "ones",
      [](const Shape& s, DType dt, const Device& d, bool rg) {
        return ones(s, options(dt, d, rg));
      },
      "size"_a, "dtype"_a, "device"_a, "requires_grad"_a, nogil());
  m.def(
      "full",
      [](const Shape& s, double v, DType dt, const Device& d, bool rg) {
        return full(s, v, options(dt, d, rg));
      },
      "size"_a, "fill_value"_a, "dtype"_a, "device"_a, "requires_grad"_a, nogil());
  m.def(
      "arange",
      [](double start, double end, double step, DType dt, const Device& d, bool rg) {
        return arange(start, end, step, options(dt, d, rg));
      },
      "start"_a, "end"_a, "step"_a, "dtype"_a, "device"_a, "requires_grad"_a, nogil());
  m.def(
      "rand",
      [](const Shape& s, DType dt, const Device& d, bool rg, Generator* g) {
        return rand(s, options(dt, d, rg), g);
      },
      "size"_a, "dtype"_a, "device"_a, "requires_grad"_a, "generator"_a = nullptr, nogil());
  m.def(
      "randn",
      [](const Shape& s, DType dt, const Device& d, bool rg, Generator* g) {
        return randn(s, options(dt, d, rg), g);
      },
      "size"_a, "dtype"_a, "device"_a, "requires_grad"_a, "generator"_a = nullptr, nogil());
  m.def(
      "randint",
      [](int64_t lo, int64_t hi, const Shape& s, DType dt, const Device& d, bool rg, Generator* g) {
        return randint(lo, hi, s, options(dt, d, rg), g);
      },
      "low"_a, "high"_a, "size"_a, "dtype"_a, "device"_a, "requires_grad"_a,
      "generator"_a = nullptr, nogil());
  m.def("empty_like", &empty_like, nogil());
  m.def("zeros_like", &zeros_like, nogil());
  m.def("ones_like", &ones_like, nogil());
  m.def("full_like", &full_like, "input"_a, "fill_value"_a, nogil());
  m.def("scalar_tensor", &scalar_tensor, "value"_a, "dtype"_a = DType::Float32, "device"_a = kCPU,
        nogil());
  m.def("from_numpy", &from_numpy, "array"_a);
  m.def("to_fp8", &to_fp8, "input"_a, "dtype"_a, "saturate"_a = true, nogil());
  m.def(
      "memory_stats", [](const Device& d) { return stats_dict(memory_stats(d)); },
      "device"_a = kCPU);
  m.def("reset_peak_memory_stats", &reset_peak_memory_stats, "device"_a = kCPU);
  m.def("empty_cache", &empty_cache, "device"_a = kCPU);
  m.def("cuda_is_built", &cuda_is_built);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_synchronize", &cuda_synchronize, "device"_a = -1, nogil());
  py::class_<CudaGraph>(m, "CudaGraph", "A captured CUDA graph (Note [CUDA graphs]).")
      .def(py::init<int>(), "device"_a = -1)
      .def("capture_begin", &CudaGraph::capture_begin)
      .def("capture_end", &CudaGraph::capture_end, nogil())
      .def("replay", &CudaGraph::replay, nogil())
      .def_property_readonly("ready", &CudaGraph::ready)
      .def_property_readonly("device", &CudaGraph::device);
}

void bind_tensor(TensorClass& cls) {
  cls.def(py::init([](const Tensor& t) { return t; }), "other"_a,
          "A new handle to the same tensor (for subclasses such as parameters).")
      .def_property_readonly("_shape",
                             [](const Tensor& t) {
                               py::tuple r(t.dim());
                               for (int64_t i = 0; i < t.dim(); ++i) r[i] = t.size(i);
                               return r;
                             })
      .def(
          "stride",
          [](const Tensor& t, std::optional<int64_t> d) -> py::object {
            if (d) return py::int_(t.stride(*d));
            return py::tuple(py::cast(t.strides()));
          },
          "dim"_a = py::none())
      .def("dim", &Tensor::dim)
      .def("ndimension", &Tensor::dim)
      .def_property_readonly("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("nelement", &Tensor::numel)
      .def("element_size", &Tensor::element_size)
      .def_property_readonly("itemsize", &Tensor::element_size)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("storage_offset", &Tensor::storage_offset)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def("_storage_ptr",
           [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.storage().data()); })
      .def("_impl_id", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.impl()); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("is_floating_point", &Tensor::is_floating_point)
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("is_cuda", &Tensor::is_cuda)
      .def_property_readonly("is_cpu", &Tensor::is_cpu)
      // ---- views ----
      .def("view", [](const Tensor& t, const py::args& a) { return t.view(shape_from_args(a)); })
      .def("reshape",
           [](const Tensor& t, const py::args& a) { return t.reshape(shape_from_args(a)); })
      .def("permute",
           [](const Tensor& t, const py::args& a) { return t.permute(shape_from_args(a)); })
      .def("expand",
           [](const Tensor& t, const py::args& a) { return t.expand(shape_from_args(a)); })
      .def("view_as", [](const Tensor& t, const Tensor& o) { return t.view(o.sizes()); })
      .def("reshape_as", [](const Tensor& t, const Tensor& o) { return t.reshape(o.sizes()); })
      .def("expand_as", [](const Tensor& t, const Tensor& o) { return t.expand(o.sizes()); })
      .def("transpose", &Tensor::transpose, "dim0"_a, "dim1"_a)
      .def("t", &Tensor::t)
      .def("narrow", &Tensor::narrow, "dim"_a, "start"_a, "length"_a)
      .def("_slice", &Tensor::slice, "dim"_a, "start"_a, "end"_a, "step"_a = 1)
      .def("select", &Tensor::select, "dim"_a, "index"_a)
      .def("squeeze", &Tensor::squeeze, "dim"_a = py::none())
      .def("unsqueeze", &Tensor::unsqueeze, "dim"_a)
      .def("flatten", &Tensor::flatten, "start_dim"_a = 0, "end_dim"_a = -1)
      .def("contiguous", &Tensor::contiguous, nogil())
      .def(
          "as_strided",
          [](const Tensor& t, const Shape& size, const Shape& stride,
             std::optional<int64_t> offset) {
            return as_strided(t, size, stride, offset.value_or(t.storage_offset()));
          },
          "size"_a, "stride"_a, "storage_offset"_a = py::none())
      // ---- conversions and copies ----
      .def("_to_dtype", py::overload_cast<DType>(&Tensor::to, py::const_), nogil())
      .def("_to_device", py::overload_cast<Device>(&Tensor::to, py::const_), nogil())
      .def(
          "float", [](const Tensor& t) { return t.to(DType::Float32); }, nogil())
      .def(
          "bfloat16", [](const Tensor& t) { return t.to(DType::BFloat16); }, nogil())
      .def(
          "half", [](const Tensor& t) { return t.to(DType::Float16); }, nogil())
      .def(
          "long", [](const Tensor& t) { return t.to(DType::Int64); }, nogil())
      .def(
          "int", [](const Tensor& t) { return t.to(DType::Int32); }, nogil())
      .def(
          "bool", [](const Tensor& t) { return t.to(DType::Bool); }, nogil())
      .def(
          "cpu", [](const Tensor& t) { return t.to(kCPU); }, nogil())
      .def(
          "cuda", [](const Tensor& t, int i) { return t.to(cuda_device(i)); }, "device"_a = 0,
          nogil())
      .def("clone", &Tensor::clone, nogil())
      .def(
          "copy_",
          [](py::object self, const Tensor& src) {
            Tensor& t = self.cast<Tensor&>();
            {
              py::gil_scoped_release unlocked;
              t.copy_(src);
            }
            return self;
          },
          "src"_a)
      .def(
          "fill_",
          [](py::object self, double v) {
            self.cast<Tensor&>().fill_(v);
            return self;
          },
          "value"_a)
      .def("zero_",
           [](py::object self) {
             self.cast<Tensor&>().zero_();
             return self;
           })
      .def("item", &item)
      .def("_numpy", &to_numpy)
      .def("__repr__", &Tensor::str)
      .def("__str__", &Tensor::str);
}

}  // namespace

void init_core(py::module_& m, TensorClass& cls) {
  py::register_exception<Error>(m, "TardelliError", PyExc_RuntimeError);
  bind_dtype_device(m);
  bind_generator(m);
  bind_factories(m);
  bind_tensor(cls);
}

}  // namespace td::python
