"""Build hook for the optional C speed-ups; everything else is in pyproject.toml.

`oncelog._speedups` accelerates JSON-lines decoding. It is optional: without a C
compiler the build goes on and oncelog runs its pure-Python path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "oncelog._speedups",
            sources=["oncelog/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
