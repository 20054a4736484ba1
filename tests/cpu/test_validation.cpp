// MOEKIT_HANDLE_VALIDATE on the reference backend: every planted bad value (tests/common/validation_cases.h) is
// answered with MOEKIT_STATUS_VALIDATION_FAILED and a message naming its tensor, an input failure writes nothing,
// and a clean call passes with the flag and gives the bits it gives without it.
#include <catch2/catch.hpp>

#include <deque>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "common/validation_cases.h"
#include "moekit/moekit.h"

using namespace moekit_test;

namespace {

class HostStore final : public TensorStore {
 public:
  moekit_tensor_t put(const HostTensor& host) override {
    tensors_.push_back(host);
    initial_.push_back(host);
    return tensors_.back().view();
  }
  HostTensor get(const moekit_tensor_t& view) override { return tensors_[index(view)]; }
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

  std::deque<HostTensor> tensors_, initial_;
  std::deque<AlignedBuffer> scratch_;
};

struct Handle {
  explicit Handle(uint32_t flags) {
    moekit_handle_desc_t d;
    moekit_handle_desc_init(&d);
    d.flags = flags;
    MOEKIT_REQUIRE_OK(moekit_handle_create(&d, &handle));
  }
  ~Handle() { moekit_handle_destroy(handle); }
  moekit_handle_t handle = nullptr;
};

}  // namespace

TEST_CASE("validation: each planted bad value fails with a message naming its tensor", "[capi][validation]") {
  for (const ValidationCase& c : validation_cases()) {
    DYNAMIC_SECTION(c.name) {
      Handle h(MOEKIT_HANDLE_VALIDATE);
      HostStore store;
      std::vector<moekit_tensor_t> outputs;
      const moekit_status_t status = c.run(h.handle, store, true, outputs);
      const std::string message = last_error();
      INFO(moekit_status_string(status) << ": " << message);
      REQUIRE(status == MOEKIT_STATUS_VALIDATION_FAILED);
      REQUIRE(message.rfind(c.tensor + ": ", 0) == 0);
      REQUIRE((message.find("element [") != std::string::npos || message.find("entry") != std::string::npos));
      // An input failure stops the call before the operation: the outputs keep every byte.
      if (!c.output_fault)
        for (const moekit_tensor_t& out : outputs) CHECK(store.get(out).bytes_equal(store.initial(out)));
    }
  }
}

TEST_CASE("validation: a clean call passes and gives the bits it gives without the flag", "[capi][validation]") {
  for (const ValidationCase& c : validation_cases()) {
    DYNAMIC_SECTION(c.name) {
      Handle plain(0), validating(MOEKIT_HANDLE_VALIDATE);
      HostStore plain_store, validating_store;
      std::vector<moekit_tensor_t> plain_out, validating_out;
      MOEKIT_REQUIRE_OK(c.run(plain.handle, plain_store, false, plain_out));
      MOEKIT_REQUIRE_OK(c.run(validating.handle, validating_store, false, validating_out));
      REQUIRE(plain_out.size() == validating_out.size());
      for (size_t i = 0; i < plain_out.size(); ++i)
        CHECK(plain_store.get(plain_out[i]).bytes_equal(validating_store.get(validating_out[i])));
    }
  }
}

TEST_CASE("validation: without the flag a planted value is dropped, refused or computed, never a crash",
          "[capi][validation]") {
  for (const ValidationCase& c : validation_cases()) {
    DYNAMIC_SECTION(c.name) {
      Handle h(0);
      HostStore store;
      std::vector<moekit_tensor_t> outputs;
      const moekit_status_t status = c.run(h.handle, store, true, outputs);
      INFO(moekit_status_string(status) << ": " << last_error());
      CHECK((status == MOEKIT_SUCCESS || status == MOEKIT_STATUS_INVALID_VALUE));
    }
  }
}
