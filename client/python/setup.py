"""pip install for the ckptd Python client, from the source tree:

    python3 -m pip install --no-build-isolation ./client/python

The extension module is the same CMake target the build tree uses (_ckptd, a pybind11 wrapper
of the C++ client), built for the interpreter running pip; the Debian packages of
deploy/install-deps.sh must be present. --no-build-isolation lets pip use the installed
setuptools instead of downloading one.

CUDA: the extension is built the way the CMake build decides it (cmake/Cuda.cmake), so with the
CUDA path — CUDA tensors handed to the daemon as IPC handles — when a CUDA toolkit is found
(CUDAToolkit_ROOT, nvcc on PATH, or /usr/local/cuda), and CPU-only otherwise; the build prints
which. CKPTD_WITH_CUDA=ON makes a missing toolkit an error, OFF builds CPU-only. A CPU-only
client raises ckptd.Error UNIMPLEMENTED for CUDA tensors. `ckptd._ckptd.built_with_cuda()`
tells an installed package which it is.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _cuda_choice():
    choice = os.environ.get("CKPTD_WITH_CUDA", "AUTO").upper()
    if choice not in ("AUTO", "ON", "OFF"):
        sys.exit("CKPTD_WITH_CUDA must be AUTO, ON or OFF, not %r" % choice)
    return choice


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        configure = subprocess.run([
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release", "-DCKPT_BUILD_TESTS=OFF", "-DCKPT_BUILD_BENCH=OFF",
            "-DCKPT_WITH_CUDA=" + _cuda_choice(), "-DPython3_EXECUTABLE=" + sys.executable],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(configure.stdout)
        if configure.returncode != 0:
            sys.exit("cmake configure of %s failed (exit %d)" % (ROOT, configure.returncode))
        # cmake/Cuda.cmake says which backend it chose; say it where pip's user sees it.
        found = re.search(r"ckptd: CUDA backend (ON|OFF)[^\n]*", configure.stdout)
        summary = found.group(0) if found else "ckptd: CUDA backend OFF (not configured)"
        sys.stderr.write("ckptd: building the Python client %s\n" % (
            "WITH the CUDA path (" + summary + ")" if found and found.group(1) == "ON"
            else "CPU-only (" + summary + "): CUDA tensors will raise UNIMPLEMENTED"))
        subprocess.check_call(["cmake", "--build", str(build), "--target", "_ckptd"])
        built = next((build / "python" / "ckptd").glob("_ckptd.*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)
        # _ckptd_torch and the record of the libtorch it links (client/python/tensor_probe.h):
        # built along with _ckptd where PyTorch's headers are (libtorch-dev), absent otherwise.
        for probe in [*(build / "python" / "ckptd").glob("_ckptd_torch*.so"),
                      *(build / "python" / "ckptd").glob("_torch_probe_build.py")]:
            shutil.copy2(probe, dest.parent / probe.name)


setup(
    name="ckptd",
    version="0.1.0",
    description="Client of ckptd, the node checkpoint daemon for large-model training",
    packages=["ckptd"],
    package_dir={"ckptd": "ckptd"},
    ext_modules=[Extension("ckptd._ckptd", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
