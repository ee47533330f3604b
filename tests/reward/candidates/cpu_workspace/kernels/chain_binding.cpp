#include <pybind11/pybind11.h>
#include <cstdint>

void chain_raw(std::int64_t src, std::int64_t dst, std::int64_t n, double s, double b);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("chain_raw", &chain_raw); }
