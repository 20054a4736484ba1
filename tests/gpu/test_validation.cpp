// MOEKIT_HANDLE_VALIDATE on a CUDA handle: the planted bad values of tests/common/validation_cases.h fail as on
// the reference backend (same status, same message), a clean call passes with the bits it gives without the flag,
// a validating call on a capturing stream is refused without breaking the capture, and — the [sanitize] cases, run
// under compute-sanitizer memcheck — without the flag no planted value makes a kernel touch memory out of bounds.
#include <catch2/catch.hpp>

#include <deque>
#include <string>
#include <vector>

#include "common/validation_cases.h"
#include "gpu/gpu_util.h"

using namespace moekit_test;

namespace {

class DeviceStore final : public TensorStore {
 public:
  moekit_tensor_t put(const HostTensor& host) override {
    initial_.push_back(host);
    tensors_.emplace_back(host);
    return tensors_.back().view();
  }
  HostTensor get(const moekit_tensor_t& view) override { return tensors_[index(view)].download(); }
  HostTensor initial(const moekit_tensor_t& view) override { return initial_[index(view)]; }
  void* scratch(size_t bytes) override {
    scratch_.emplace_back(bytes);
    return scratch_.back().data();
  }

 private:
  size_t index(const moekit_tensor_t& view) const {
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].data() == view.data) return i;
    FAIL("the view is not one of this store's");
    return 0;
  }

  std::deque<DeviceTensor> tensors_;
  std::deque<HostTensor> initial_;
  std::deque<DeviceBuffer> scratch_;
};

class HostStore final : public TensorStore {
 public:
  moekit_tensor_t put(const HostTensor& host) override {
    tensors_.push_back(host);
    return tensors_.back().view();
  }
  HostTensor get(const moekit_tensor_t& view) override {
    for (HostTensor& t : tensors_)
      if (t.data() == view.data) return t;
    FAIL("the view is not one of this store's");
    return {};
  }
  HostTensor initial(const moekit_tensor_t& view) override { return get(view); }
  void* scratch(size_t bytes) override {
    scratch_.emplace_back(bytes);
    return scratch_.back().data();
  }

 private:
  std::deque<HostTensor> tensors_;
  std::deque<AlignedBuffer> scratch_;
};

struct Handle {
  Handle(moekit_backend_t backend, uint32_t flags) {
    moekit_handle_desc_t d;
    moekit_handle_desc_init(&d);
    d.backend = backend;
    d.flags = flags;
    MOEKIT_REQUIRE_OK(moekit_handle_create(&d, &handle));
  }
  ~Handle() { moekit_handle_destroy(handle); }
  moekit_handle_t handle = nullptr;
};

}  // namespace

TEST_CASE("validation: each planted bad value fails on the GPU as on the reference backend", "[gpu][validation]") {
  for (const ValidationCase& c : validation_cases()) {
    if (!c.cuda) continue;
    DYNAMIC_SECTION(c.name) {
      Handle cuda(MOEKIT_BACKEND_CUDA, MOEKIT_HANDLE_VALIDATE);
      Handle reference(MOEKIT_BACKEND_REFERENCE, MOEKIT_HANDLE_VALIDATE);
      DeviceStore device;
      HostStore host;
      std::vector<moekit_tensor_t> outputs, host_outputs;
      const moekit_status_t status = c.run(cuda.handle, device, true, outputs);
      const std::string message = last_error();
      INFO(moekit_status_string(status) << ": " << message);
      REQUIRE(status == MOEKIT_STATUS_VALIDATION_FAILED);
      REQUIRE(message.rfind(c.tensor + ": ", 0) == 0);
      REQUIRE(c.run(reference.handle, host, true, host_outputs) == MOEKIT_STATUS_VALIDATION_FAILED);
      CHECK(message == last_error());
      if (!c.output_fault)
        for (const moekit_tensor_t& out : outputs) CHECK(device.get(out).bytes_equal(device.initial(out)));
    }
  }
}

TEST_CASE("validation: a clean call passes on the GPU with the bits it gives without the flag", "[gpu][validation]") {
  for (const ValidationCase& c : validation_cases()) {
    if (!c.cuda) continue;
    DYNAMIC_SECTION(c.name) {
      Handle plain(MOEKIT_BACKEND_CUDA, 0), validating(MOEKIT_BACKEND_CUDA, MOEKIT_HANDLE_VALIDATE);
      DeviceStore plain_store, validating_store;
      std::vector<moekit_tensor_t> plain_out, validating_out;
      MOEKIT_REQUIRE_OK(c.run(plain.handle, plain_store, false, plain_out));
      MOEKIT_REQUIRE_OK(c.run(validating.handle, validating_store, false, validating_out));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      REQUIRE(plain_out.size() == validating_out.size());
      for (size_t i = 0; i < plain_out.size(); ++i)
        CHECK(plain_store.get(plain_out[i]).bytes_equal(validating_store.get(validating_out[i])));
    }
  }
}

TEST_CASE("validation: without the flag no planted value faults on the GPU", "[gpu][validation][sanitize]") {
  for (const ValidationCase& c : validation_cases()) {
    if (!c.cuda) continue;
    DYNAMIC_SECTION(c.name) {
      Handle h(MOEKIT_BACKEND_CUDA, 0);
      DeviceStore store;
      std::vector<moekit_tensor_t> outputs;
      const moekit_status_t status = c.run(h.handle, store, true, outputs);
      INFO(moekit_status_string(status) << ": " << last_error());
      CHECK(status == MOEKIT_SUCCESS);
      // A fault would surface here as a sticky launch error; compute-sanitizer reports any out-of-bounds access.
      CUDA_REQUIRE(cudaDeviceSynchronize());
      for (const moekit_tensor_t& out : outputs) store.get(out);
    }
  }
}

TEST_CASE("validation: a validating call on a capturing stream is refused and the capture stays valid",
          "[gpu][validation][sanitize]") {
  Handle h(MOEKIT_BACKEND_CUDA, MOEKIT_HANDLE_VALIDATE);
  DeviceStore store;
  std::vector<moekit_tensor_t> outputs;
  moekit_dispatch_desc_t d;
  moekit_dispatch_desc_init(&d);
  d.max_tokens = 8;
  d.top_k = 2;
  d.experts = 4;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(h.handle, &d, &plan));
  moekit_dispatch_args_t a;
  moekit_dispatch_args_init(&a);
  a.indices = store.put(HostTensor(MOEKIT_DTYPE_INT32, {8, 2}));
  a.expert_offsets = store.put(HostTensor(MOEKIT_DTYPE_INT32, {5}));
  a.gather_idx = store.put(HostTensor(MOEKIT_DTYPE_INT32, {16}));
  a.pair_idx = store.put(HostTensor(MOEKIT_DTYPE_INT32, {16}));
  a.grouped_pos = store.put(HostTensor(MOEKIT_DTYPE_INT32, {16}));
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  void* workspace = store.scratch(bytes);
  // Everything allocated and uploaded first: a capturing thread may not call cudaMalloc or cudaMemcpy.
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK(moekit_dispatch(plan, &a, workspace, bytes, stream) == MOEKIT_STATUS_NOT_SUPPORTED);
  CHECK(last_error().rfind("stream: ", 0) == 0);
  cudaGraph_t graph = nullptr;
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CUDA_REQUIRE(cudaGraphDestroy(graph));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
  moekit_plan_destroy(plan);
}
