// The property every fuzz target holds each call of the C ABI to: it returns a status of moekit.h other than
// INTERNAL_ERROR (a bug by that status's own definition), and a call that does not succeed leaves a last-error
// message of its own that begins with the name of one of the call's arguments ("w1: expected shape ..."). A
// violation prints what was called and why it fails the property, then aborts, which libFuzzer reports as a crash
// and saves the input.
#pragma once

#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit_fuzz {

[[noreturn]] void violation(const std::string& call, const std::string& what);

// Makes this thread's last error a message no call of the fuzz targets produces, so that check_status can tell a
// message left by the call it checks from one left before it.
void mark_last_error();

// The message of the last failed call on this thread, through moekit_get_last_error (the length query, a full copy
// and a truncated one must agree).
std::string last_error(const std::string& call);

// The argument a message names: "w1: expected shape ..." names w1; "" when it names none.
std::string argument_named(const std::string& message);

// Checks `status` of `call` (made after mark_last_error): a status of moekit.h, not INTERNAL_ERROR; after a failure,
// a new message "<name>: ..." with <name> one of `names`.
void check_status(const std::string& call, moekit_status_t status, const std::vector<std::string>& names);

}  // namespace moekit_fuzz
