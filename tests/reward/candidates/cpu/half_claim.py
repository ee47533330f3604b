# Native code rewrites the report (issue 28): a C++ static initialiser rebinds json.dumps, as
# reply_patch does, and every "round_returned" line then claims 52% of the time measured. Its kernel
# (slow_wide_honest's) takes ~12 ms, so what it hides (~6 ms a call) is far beyond the call window's
# absolute slack; but below half, the claim itself stayed inside the window's old `1.0 * claimed`
# allowance. With the snapshot off (what a forger in C++ would defeat), only the parent's clock is
# left: the time decided is at least what it saw around the call less the reference's overhead
# (rounds.call_floor, disabled_guards "call_wall_floor"), so the forgery buys nothing.
_patch = load_inline(
    name="opsynth_test_half_claim",
    cpp_sources=r"""
#include <torch/extension.h>
namespace py = pybind11;

static py::object* orig_dumps = nullptr;  // never freed: no destructor after the interpreter's end

static py::object shaved(py::object obj, py::kwargs kw) {
    if (py::isinstance<py::dict>(obj)) {
        py::dict d = obj.cast<py::dict>();
        if (d.contains("kind") && d["kind"].cast<std::string>() == "round_returned" && d.contains("ms")) {
            py::dict c;
            for (auto item : d) c[item.first] = item.second;
            c["ms"] = py::float_(d["ms"].cast<double>() * 0.52);
            return (*orig_dumps)(c, **kw);
        }
    }
    return (*orig_dumps)(obj, **kw);
}

static int patch_reply() {
    PyGILState_STATE g = PyGILState_Ensure();
    int done = 0;
    try {
        py::module_ json = py::module_::import("json");
        orig_dumps = new py::object(json.attr("dumps"));
        py::setattr(json, "dumps", py::cpp_function(shaved, py::name("dumps")));
        done = 1;
    } catch (...) { PyErr_Clear(); }
    PyGILState_Release(g);
    return done;
}
static int patched = patch_reply();

int64_t loaded() { return patched; }
""",
    functions=["loaded"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return atk.slow_chain(x, self.scale, self.shift, 7)  # correct, ~1.5x eager
