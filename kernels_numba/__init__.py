"""Every GPU kernel the engine runs, one file per family, each with its numpy reference twin.

Each module reads like a lesson: the math in the module docstring, the `cuda.jit` kernel, a small
launcher that picks the grid and returns a device array, and `*_ref`, the numpy twin the tests use.
Readable and superseded variants that the engine does not run live apart, in lessons/.
"""
