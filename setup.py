"""Build hook for the optional C speed-ups; everything else is in pyproject.toml.

`oncelog._speedups` accelerates JSON-lines decoding and sequencing (`Sequencer`),
`oncelog._bulk` publishing's stamping and framing, `oncelog._spool` each append. They are
optional: without a C compiler the build goes on and oncelog runs its pure-Python path
(the same results, slower). Set `ONCELOG_REQUIRE_SPEEDUPS=1` (CI does) to make a failed
compile fail the build instead of being skipped with a warning.
"""

import os

from setuptools import Extension, setup

REQUIRE_ENV = "ONCELOG_REQUIRE_SPEEDUPS"
required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")

setup(
    ext_modules=[
        Extension(
            "oncelog._speedups",
            sources=["oncelog/_speedups.c"],
            optional=not required,
            extra_compile_args=["-O2"],
        ),
        # Bulk stamping and framing for Publisher.publish_many (pure fallback:
        # oncelog._bulkframing); optional, and required in CI, like the one above.
        Extension(
            "oncelog._bulk",
            sources=["oncelog/_bulk.c"],
            optional=not required,
            extra_compile_args=["-O2"],
        ),
        # The per-append steps of a journal's appender (pure fallback:
        # oncelog.journal._spoolcore); optional, and required in CI, like the others.
        Extension(
            "oncelog._spool",
            sources=["oncelog/_spool.c"],
            optional=not required,
            extra_compile_args=["-O2"],
        ),
    ]
)
