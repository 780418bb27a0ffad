// Force-included (g++ -include) before any nlohmann/json.hpp in every translation unit of load-plan.
// Written for load-plan; not MSCCL++ code.
//
// MSCCL++'s plan loader indexes *const* nlohmann::json objects with operator[] (e.g. gpu["id"] where
// gpu is `const auto&`). For a missing key nlohmann then only has JSON_ASSERT (plain assert(), and in a
// release build with NDEBUG: undefined behaviour). Turning the assertion into a C++ exception lets
// load-plan report "missing required field" as a refusal with a message instead of crashing.
// (If the assertion fires inside a noexcept nlohmann function, std::terminate -> abort, which
// load-plan also reports as a refusal.)
#pragma once
#include <stdexcept>
#define JSON_ASSERT(x)                                                                              \
  do {                                                                                              \
    if (!(x))                                                                                       \
      throw std::logic_error("nlohmann::json assertion failed: " #x                                 \
                             " (missing key / wrong type / index out of range in a const JSON access)"); \
  } while (0)
