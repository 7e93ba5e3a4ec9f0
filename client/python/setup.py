"""pip install for the ckptd Python client, from the source tree:

    python3 -m pip install --no-build-isolation ./client/python

The extension module is the same CMake target the build tree uses (_ckptd, a pybind11 wrapper
of the C++ client), built for the interpreter running pip; the Debian packages of
deploy/install-deps.sh must be present. --no-build-isolation lets pip use the installed
setuptools instead of downloading one.
"""
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release", "-DCKPT_BUILD_TESTS=OFF", "-DCKPT_BUILD_BENCH=OFF",
            "-DCKPT_WITH_CUDA=OFF", "-DPython3_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", str(build), "--target", "_ckptd"])
        built = next((build / "python" / "ckptd").glob("_ckptd*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


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
