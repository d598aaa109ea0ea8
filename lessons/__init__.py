"""Readable and superseded kernels the engine does not run, each explaining a production kernel in kernels_numba/.

Every module opens with the production kernel it explains and what it does differently; lessons/README.md is the
index. Production code never imports from here; the lessons import the production helpers they share.
"""
