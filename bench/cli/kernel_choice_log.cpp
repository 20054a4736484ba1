#include "kernel_choice_log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

namespace moekit_bench {
namespace {

constexpr const char* kVariable = "MOEKIT_LOG_CONFIG";
constexpr const char* kPrefix = "moekit: ";

// stderr (file descriptor 2) pointed at a temporary file while it lives, and MOEKIT_LOG_CONFIG set to 1.
class StderrCapture {
 public:
  StderrCapture() {
    if (const char* old = std::getenv(kVariable)) old_value_ = old;
    setenv(kVariable, "1", 1);
    std::fflush(stderr);
    file_ = std::tmpfile();
    saved_fd_ = file_ != nullptr ? dup(2) : -1;
    if (saved_fd_ >= 0) dup2(fileno(file_), 2);
  }
  ~StderrCapture() {
    restore();
    if (file_ != nullptr) std::fclose(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Puts stderr and the variable back and returns everything written meanwhile, line by line.
  std::vector<std::string> finish() {
    restore();
    std::vector<std::string> lines;
    if (file_ == nullptr) return lines;
    std::rewind(file_);
    std::string line;
    for (int c = std::fgetc(file_); c != EOF; c = std::fgetc(file_)) {
      if (c != '\n') {
        line.push_back(static_cast<char>(c));
        continue;
      }
      lines.push_back(line);
      line.clear();
    }
    if (!line.empty()) lines.push_back(line);
    return lines;
  }

 private:
  void restore() {
    if (saved_fd_ >= 0) {
      std::fflush(stderr);
      dup2(saved_fd_, 2);
      close(saved_fd_);
      saved_fd_ = -1;
    }
    if (old_value_) {
      setenv(kVariable, old_value_->c_str(), 1);
    } else {
      unsetenv(kVariable);
    }
  }

  std::optional<std::string> old_value_;
  std::FILE* file_ = nullptr;
  int saved_fd_ = -1;
};

}  // namespace

std::vector<std::string> capture_kernel_choices(const std::function<void()>& create) {
  StderrCapture capture;
  create();
  std::vector<std::string> choices;
  for (const std::string& line : capture.finish()) {
    if (line.rfind(kPrefix, 0) == 0) {
      choices.push_back(line.substr(std::string(kPrefix).size()));
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  return choices;
}

}  // namespace moekit_bench
