// The planted-value cases of MOEKIT_HANDLE_VALIDATE, shared by the CPU test (reference backend) and the GPU test
// (CUDA backend): each case is one valid call of one operation, which can be run with one bad value planted in one
// tensor. A TensorStore puts the call's tensors in the memory of the handle's backend.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "moekit/moekit.h"

namespace moekit_test {

class TensorStore {
 public:
  virtual ~TensorStore() = default;
  // A view of a copy of `host` in the backend's memory; valid until the store is destroyed.
  virtual moekit_tensor_t put(const HostTensor& host) = 0;
  // What a view from put() holds now, and what it held when put.
  virtual HostTensor get(const moekit_tensor_t& view) = 0;
  virtual HostTensor initial(const moekit_tensor_t& view) = 0;
  // Scratch memory (workspace, saved buffer) of `bytes`, 256-byte aligned; NULL for 0.
  virtual void* scratch(size_t bytes) = 0;
};

struct ValidationCase {
  std::string name;
  std::string tensor;  // the tensor holding the planted value: the failure message begins with it
  bool cuda;           // the CUDA backend serves the operation
  bool output_fault;   // the planted value is caught in an output (the operation ran)
  // Runs the call on `handle` with its tensors in `store` (a bad value planted when `plant`); the views of the
  // call's outputs are appended to `outputs`.
  std::function<moekit_status_t(moekit_handle_t handle, TensorStore& store, bool plant,
                                std::vector<moekit_tensor_t>& outputs)>
      run;
};

const std::vector<ValidationCase>& validation_cases();

}  // namespace moekit_test
