"""Ships the API's .proto files inside the wheel's ``ordrec/v1`` package.

The files live once, in ``proto/ordrec/v1`` (the design keeps them there); the
build copies them beside the generated code so clients in other languages can
generate their stubs from an installed package. Everything else is in
pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_SOURCES = Path("proto", "ordrec", "v1")


class BuildPyWithProtos(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib, "ordrec", "v1")
        self.mkpath(str(target))  # an editable build copies no package files there
        for source in sorted(PROTO_SOURCES.glob("*.proto")):
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithProtos})
