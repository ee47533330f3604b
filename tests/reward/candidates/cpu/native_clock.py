# A C++ static initialiser rewrites the C function behind time.perf_counter in the method table of
# the time module: a clock 1000x slow. time.perf_counter stays the same object (its identity passes).
_clock = load_inline(
    name="opsynth_test_native_clock",
    cpp_sources=r"""
#include <torch/extension.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static PyObject* slow_perf_counter(PyObject*, PyObject*) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return PyFloat_FromDouble((ts.tv_sec + ts.tv_nsec * 1e-9) * 1e-3);
}

static int patch_clock() {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject* time = PyImport_ImportModule("time");
    PyObject* f = time ? PyObject_GetAttrString(time, "perf_counter") : nullptr;
    if (f && PyCFunction_Check(f)) {
        PyMethodDef* def = ((PyCFunctionObject*)f)->m_ml;
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t a = (uintptr_t)def & ~(uintptr_t)(page - 1);
        mprotect((void*)a, 2 * page, PROT_READ | PROT_WRITE);
        def->ml_meth = (PyCFunction)slow_perf_counter;
    }
    PyErr_Clear();
    PyGILState_Release(g);
    return 0;
}
static int patched = patch_clock();

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
        return atk.slow_chain(x, self.scale, self.shift, 200)  # correct, 200x slower than it needs to be
