// A router plan through the C ABI and its host workspace, destroyed with the owner (the router tests share it).
#pragma once

#include <catch2/catch.hpp>

#include "common/test_util.h"

struct RouterPlan : moekit_test::PlanOwner {
  RouterPlan(moekit_handle_t handle, const moekit_router_desc_t& desc) {
    MOEKIT_REQUIRE_OK(moekit_router_plan_create(handle, &desc, &plan));
    size_workspace();
  }
};
