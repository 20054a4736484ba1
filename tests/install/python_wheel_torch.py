"""The PyTorch tests of examples/python against the installed wheel (CTest install_python_wheel_torch, run after
install_python_wheel through examples/python/run_test.sh, which picks a Python that imports torch):

    python python_wheel_torch.py WORK_DIR

A fresh virtualenv that sees this Python's torch (through a .pth file naming torch's folder of packages) installs
the wheel that install_python_wheel left in WORK_DIR/dist, alone; examples/python/test_moekit.py, test_options.py,
test_compile.py, test_hf.py, test_aux_losses.py and test_ep.py run there with -P, so that `import moekit` is the
installed package with its bundled libraries. Exits 77 (CTest: skipped) where torch cannot be imported, where Python is older
than 3.11 (no -P), or where there is no wheel (install_python_wheel skipped, or was not run).
"""
import glob
import os
import pathlib
import subprocess
import sys
import venv

try:
    import torch
except ImportError as error:
    print("python_wheel_torch: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

TESTS = [pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / name
         for name in ("test_moekit.py", "test_options.py", "test_compile.py", "test_hf.py", "test_aux_losses.py",
                      "test_ep.py")]


def main(work):
    if sys.version_info < (3, 11):
        print("python_wheel_torch: Python %d.%d has no -P (3.11+): skipped" % sys.version_info[:2])
        return 77
    wheels = glob.glob(os.path.join(work, "dist", "moekit-*.whl"))
    if len(wheels) != 1:
        print("python_wheel_torch: no wheel in %s/dist (install_python_wheel builds it): skipped" % work)
        return 77
    env = os.path.join(work, "env-torch")
    venv.EnvBuilder(clear=True, with_pip=True).create(env)
    python = os.path.join(env, "bin", "python")
    environment = {k: v for k, v in os.environ.items() if k not in ("MOEKIT_LIBRARY", "PYTHONPATH")}
    # torch's folder of packages (system-wide, or another virtualenv's, which system_site_packages would not
    # reach) comes after the new environment's own, where the wheel goes.
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    pathlib.Path(purelib, "torch-site.pth").write_text(str(pathlib.Path(torch.__file__).parents[1]) + "\n")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheels[0]], check=True,
                   env=environment)
    # The package and the library must be the installed ones, not the source tree's or another build's.
    subprocess.run([python, "-P", "-c", "import sys, moekit; from moekit import _capi; "
                    "assert moekit.__file__.startswith(sys.prefix), moekit.__file__; "
                    "assert moekit.library_path() == _capi.BUNDLED, moekit.library_path()"],
                   check=True, env=environment, cwd=work)
    print("python_wheel_torch: torch %s from %s" % (torch.__version__, os.path.dirname(torch.__file__)))
    codes = [subprocess.run([python, "-P", str(test)], env=environment, cwd=work).returncode for test in TESTS]
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
