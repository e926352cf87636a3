"""OpenCL C generators, one module per family of ops; each returns ``Kernel`` records."""
