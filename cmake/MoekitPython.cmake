# MOEKIT_PYTHON: the Python interpreter of the PyTorch tests (examples/python, install_python_wheel_torch), passed
# to them as the environment variable of the same name. Defaults to the virtualenv that .ci/install-deps makes
# (torch 2.4+ and transformers from PyPI) where it exists; empty, the tests take the first Python on PATH that
# imports torch, and are skipped (77) where none does.
set(_moekit_ci_python /opt/moekit/torch-venv/bin/python)
if(EXISTS "${_moekit_ci_python}")
  set(_moekit_python_default "${_moekit_ci_python}")
else()
  set(_moekit_python_default "")
endif()
set(MOEKIT_PYTHON "${_moekit_python_default}" CACHE FILEPATH "Python (with torch) of the PyTorch tests")
if(MOEKIT_PYTHON)
  message(STATUS "moekit: PyTorch tests run with ${MOEKIT_PYTHON}")
endif()
